"""Replay OpenRLHF's remote reward-model client against `emoreward serve` on loopback: requests/s, latency, and
rewards lost after the client's retries.

Usage:
    python benchmarks/benchmark_server.py [--model DIR] [--tree PATH] [--texts words|short|ovmerd]
        [--per-sample 64 256] [--requests-per-client 4] [--batch 1024] [--throughput-clients 4 64] [--threads N]
        [--server-arg=--max-batch-tokens=8192 ...] [--output bench.json]
    python benchmarks/benchmark_server.py --engine ray --replicas 1 2 --threads 1 --per-sample 64 256 \
        --verl-clients 64 --kill-replica --throughput-clients --batch --output ray.json

The server is a subprocess (`emoreward serve`, from `--tree`, default this checkout) on `--model` or a fresh MiniLM
value head. Scenarios: OpenRLHF's per-sample client (a new connection per attempt, 180 s timeout, 5 tries 1 s
apart), its older batch client, `--throughput-clients`, `--verl-clients`, `--kill-replica` (Ray) and
`--slow-clients`; `--in-process` measures the same texts without the server. Each reports descriptions/s, p50 / p99,
lost rewards and CPU per description. Details: docs/speed.md ("How to measure"); figures: ("What to expect").
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
PROMPT = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nDescribe the emotional state "
    "of the person in the video: facial expression, voice, words, intensity and how it changes.<|im_end|>\n"
    "<|im_start|>assistant\n"
)
EOS = "<|im_end|>"
PAD = "<|endoftext|>"
TRIES, RETRY_SLEEP_S, TIMEOUT_S = 5, 1.0, 180.0  # OpenRLHF's _post_request / request_api_wrapper


# ---------------------------------------------------------------------------------------------- payloads
def short_texts(n: int, seed: int = 0) -> list[str]:
    """One-sentence descriptions, 12-20 words (about 15-25 tokens)."""
    rng = random.Random(seed)
    who = ["The woman", "The man", "The speaker", "She", "He", "The girl", "The old man"]
    state = ["looks happy", "seems sad", "is clearly angry", "is surprised", "sounds worried", "is calm", "is tense"]
    how = [
        "and smiles broadly while talking",
        "with a trembling voice and lowered eyes",
        "frowning and raising her voice towards the end",
        "her eyebrows raised and mouth open",
        "speaking slowly, looking away from the camera",
        "with relaxed shoulders and a steady voice",
    ]
    end = ["; the feeling grows stronger.", ", then relaxes.", ".", "; it fades by the end.", ", mixed with fear."]
    return [f"{rng.choice(who)} {rng.choice(state)} {rng.choice(how)}{rng.choice(end)}" for _ in range(n)]


def word_texts(n: int, seed: int = 0) -> list[str]:
    """Three- to five-word descriptions (about 5-8 tokens): the regime where per-request overhead dominates."""
    rng = random.Random(seed)
    who, state = ["She", "He", "The man", "The girl"], ["is happy", "looks sad", "is angry", "seems calm"]
    return [f"{rng.choice(who)} {rng.choice(state)}." for _ in range(n)]


def ovmerd_texts(n: int, seed: int = 0) -> list[str]:
    """Real MLLM-written emotion descriptions (OV-MERD, shipped in emoreward/data/files; median 680 characters)."""
    path = ROOT / "emoreward" / "data" / "files" / "ovmerd" / "ovmerd_descriptions_subtitle.jsonl"
    rows = [json.loads(line)["description"] for line in path.read_text(encoding="utf-8").splitlines() if line]
    rows = [r for r in rows if r.strip()]
    rng = random.Random(seed)
    return [rng.choice(rows) for _ in range(n)]


# ---------------------------------------------------------------------------------------------- the client
class HTTPError(Exception):
    def __init__(self, status: int, body: bytes):
        super().__init__(f"HTTP {status}")
        self.status = status
        self.body = body


async def post_once(host: str, port: int, path: str, body: bytes, headers: dict[str, str] | None = None) -> dict:
    """One POST on a new connection; the JSON reply, or HTTPError on a 4xx/5xx (raise_for_status)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        head = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}", "Content-Type: application/json"]
        head += [f"Content-Length: {len(body)}", *(f"{k}: {v}" for k, v in (headers or {}).items())]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
        await writer.drain()
        status_line = await reader.readline()
        if not status_line:
            raise ConnectionError("server closed the connection")
        status = int(status_line.split()[1])
        length = 0
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip())
        data = await reader.readexactly(length) if length else b""
    finally:
        writer.close()
    if status >= 400:
        raise HTTPError(status, data)
    return json.loads(data)


class Tally:
    """What the clients saw: latencies of answered requests, lost requests, failed attempts by cause."""

    def __init__(self):
        self.latencies: list[float] = []
        self.lost = 0
        self.failed_attempts: dict[str, int] = {}

    def fail(self, err: BaseException) -> None:
        key = f"HTTP {err.status}" if isinstance(err, HTTPError) else type(err).__name__
        self.failed_attempts[key] = self.failed_attempts.get(key, 0) + 1


async def post_aiohttp(host: str, port: int, path: str, body: bytes) -> dict:
    """One POST as OpenRLHF's per-sample client sends it (`--client aiohttp`): a fresh `aiohttp.ClientSession` per
    attempt, ``raise_for_status``, the JSON reply."""
    import aiohttp

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_S)) as session:
        headers = {"Content-Type": "application/json"}
        async with session.post(f"http://{host}:{port}{path}", data=body, headers=headers) as response:
            if response.status >= 400:
                raise HTTPError(response.status, await response.read())
            return await response.json()


# the per-sample client's transport: the minimal asyncio client (default) or aiohttp, as OpenRLHF itself (--client)
CLIENT = {"post": post_once}


async def openrlhf_post(host: str, port: int, path: str, payload: dict, tally: Tally, retries: bool = True) -> None:
    """OpenRLHF's `_post_request`: up to 5 tries, each on a new connection with a 180 s total timeout, 1 s apart."""
    body = json.dumps(payload).encode("utf-8")
    start = time.perf_counter()
    post = CLIENT["post"]
    for _ in range(TRIES if retries else 1):
        try:
            await asyncio.wait_for(post(host, port, path, body), TIMEOUT_S)
            tally.latencies.append(time.perf_counter() - start)
            return
        except (OSError, asyncio.TimeoutError, HTTPError, ValueError, asyncio.IncompleteReadError) as err:
            tally.fail(err)
        if retries:
            await asyncio.sleep(RETRY_SLEEP_S)
    tally.lost += 1


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# process roles by a part of their command line (first match): Ray Serve's actors, Ray's node services and agents
ROLES = {
    "ServeReplica": "ServeReplica",
    "ProxyActor": "ProxyActor",
    "ServeController": "ServeController",
    "raylet": "raylet",
    "gcs_server": "gcs_server",
    "DashboardAgent": "dashboard_agent",
    "RuntimeEnvAgent": "runtime_env_agent",
    "dashboard/dashboard.py": "dashboard_head",
    "log_monitor.py": "log_monitor",
    "autoscaler/_private/monitor.py": "autoscaler_monitor",
    "ray::IDLE": "idle_workers",
    "spawn_main": "model_process",  # emoreward serve's model process (the default; --no-model-process: none)
}


def tree_cpu_by_role(pid: int) -> dict[str, float]:
    """CPU seconds of a process and all its descendants, by role (`ROLES`): a Ray server's replicas, proxy,
    controller, raylet, GCS, dashboard head and agents, log monitor, autoscaler monitor and idle workers, or the
    single server's model process (its default), by their command lines, ``server`` for the root process,
    ``other`` for the rest."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    roles: dict[str, float] = {}
    todo = [pid]
    while todo:
        current = todo.pop()
        try:
            title = Path(f"/proc/{current}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            role = "server" if current == pid else next((r for k, r in ROLES.items() if k in title), "other")
            roles[role] = roles.get(role, 0.0) + cpu_seconds(current)
        except OSError:
            pass
        todo += children.get(current, [])
    return roles


def tree_cpu_seconds(pid: int) -> float:
    """CPU time of a process and all its descendants (a Ray server: the driver, raylet, proxy and replicas)."""
    return sum(tree_cpu_by_role(pid).values())


def summary(name: str, tally: Tally, wall: float, sent: int, descriptions_per_request: int) -> dict:
    lat = sorted(tally.latencies)
    answered = len(lat)

    def pct(q: float) -> float:
        return 1000 * lat[min(len(lat) - 1, int(q * len(lat)))] if lat else float("nan")

    return {
        "scenario": name,
        "requests": sent,
        "answered": answered,
        "descriptions": answered * descriptions_per_request,
        "lost": tally.lost,
        "failed_attempts": tally.failed_attempts,
        "wall_s": round(wall, 3),
        "requests_per_s": round(answered / wall, 1),
        "descriptions_per_s": round(answered * descriptions_per_request / wall, 1),
        "p50_ms": round(pct(0.50), 1),
        "p99_ms": round(pct(0.99), 1),
        "load_1min": round(os.getloadavg()[0], 2),
    }


async def per_sample(host, port, texts, clients: int, per_client: int, tally: Tally | None = None) -> dict:
    """`clients` OpenRLHF samples in flight at once, each client sending `per_client` samples back to back."""
    tally = tally or Tally()
    random.Random(clients).shuffle(texts)

    async def client(c: int) -> None:
        for r in range(per_client):
            text = texts[(c * per_client + r) % len(texts)]
            query = PROMPT + text + EOS
            await openrlhf_post(
                host, port, "/get_reward", {"query": [query], "prompts": [PROMPT], "labels": [""]}, tally
            )

    start = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(clients)))
    return summary(f"per-sample x{clients}", tally, time.perf_counter() - start, clients * per_client, 1)


async def slow_body(host: str, port: int, stop: asyncio.Event, gap: float = 2.0) -> str:
    """A hostile client (`--slow-clients`): a request head, then its body one byte every ``gap`` s, reconnecting
    ``gap`` s after it is cut off, until ``stop``. Returns how its last connection ended."""
    body = json.dumps({"descriptions": ["x" * 64]}).encode()
    head = f"POST /v1/rewards HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ended = "held"
    while not stop.is_set():
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 5 * gap)
        except (OSError, asyncio.TimeoutError) as err:
            ended = type(err).__name__
            await asyncio.sleep(gap)
            continue
        try:
            writer.write(head.encode())
            for k in range(len(body) - 1):  # never the last byte
                writer.write(body[k : k + 1])
                try:
                    line = await asyncio.wait_for(reader.readline(), gap)
                except asyncio.TimeoutError:
                    if stop.is_set():
                        break
                    continue
                ended = line.split()[1].decode() if line.startswith(b"HTTP/1.1 ") else "closed"
                break
        except OSError as err:
            ended = type(err).__name__
        finally:
            writer.close()
        await asyncio.sleep(gap)  # a slow client, not a connection flood: it reconnects at its own pace
    return ended


async def with_slow_clients(host: str, port: int, n: int, scenario) -> dict:
    """``scenario`` while ``n`` slow-body clients hold connections (their outcomes counted in the result)."""
    stop = asyncio.Event()
    hostile = [asyncio.create_task(slow_body(host, port, stop)) for _ in range(n)]
    await asyncio.sleep(2.0)  # they hold their slots a while before the measured clients come
    result = await scenario
    stop.set()
    ends = await asyncio.gather(*hostile)
    result["scenario"] += f" + {n} slow clients"
    result["slow_clients_ended"] = {end: ends.count(end) for end in sorted(set(ends))}
    return result


async def batch(host, port, texts, n: int) -> dict:
    """Older OpenRLHF: the whole rollout batch in one request, queries decoded from left- and right-padded rows."""
    tally = Tally()
    width = max(len(t) for t in texts[:n])
    queries = []
    for k in range(n):
        text = texts[k % len(texts)]
        left, right = (k % 3), (width - len(text)) // 40  # a few pad tokens on both sides, as batch_decode writes
        queries.append(PAD * left + PROMPT + text + EOS + PAD * right)
    payload = {"query": queries, "prompts": [PROMPT] * n, "labels": [""] * n}
    start = time.perf_counter()
    await openrlhf_post(host, port, "/get_reward", payload, tally)
    return summary(f"batch of {n}", tally, time.perf_counter() - start, 1, n)


async def throughput(host, port, texts, clients: int, per_client: int) -> dict:
    """`clients` clients x `per_client` requests of 4 descriptions on /v1/rewards, no retries (503 = failed)."""
    tally = Tally()

    async def client(c: int) -> None:
        for r in range(per_client):
            k = 4 * (c * per_client + r)
            descriptions = [texts[(k + j) % len(texts)] for j in range(4)]
            await openrlhf_post(host, port, "/v1/rewards", {"descriptions": descriptions}, tally, retries=False)

    start = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(clients)))
    return summary(f"throughput x{clients}", tally, time.perf_counter() - start, clients * per_client, 4)


VERL_OPTIONS: dict = {}  # reward_kwargs of the verl client (--verl-merge)


async def verl_per_sample(url: str, texts, clients: int, per_client: int, tally: Tally | None = None) -> dict:
    """verl's reward loop: `clients` tasks awaiting `compute_score_async`, each `per_client` samples in a row."""
    from emoreward.export import verl

    tally = tally or Tally()

    async def client(c: int) -> None:
        for r in range(per_client):
            text = texts[(c * per_client + r) % len(texts)]
            start = time.perf_counter()
            try:
                await verl.compute_score_async(solution_str=text, extra_info={}, server_url=url, **VERL_OPTIONS)
                tally.latencies.append(time.perf_counter() - start)
            except RuntimeError as err:
                tally.fail(err)
                tally.lost += 1

    start = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(clients)))
    return summary(f"verl x{clients}", tally, time.perf_counter() - start, clients * per_client, 1)


async def killed_replica(host, port, texts, clients: int, per_client: int, replicas: int, verl: bool = False) -> dict:
    """The per-sample load (OpenRLHF's client, or verl's with ``verl``) with one replica process killed (SIGKILL) once
    a third of the samples are answered; first every replica is up (one killed before has been replaced)."""
    deadline, seen = time.monotonic() + 300, set()
    while len(seen) < replicas and time.monotonic() < deadline:
        seen.add(int((await get_json(host, port, "/health"))["replica"]))
        await asyncio.sleep(0.05)
    victim = min(seen)
    tally = Tally()
    if verl:
        load = asyncio.ensure_future(verl_per_sample(f"http://{host}:{port}", texts, clients, per_client, tally))
    else:
        load = asyncio.ensure_future(per_sample(host, port, texts, clients, per_client, tally))
    while not load.done() and len(tally.latencies) < clients * per_client // 3:
        await asyncio.sleep(0.02)
    os.kill(victim, signal.SIGKILL)
    result = await load
    result["scenario"] += ", a replica killed at 1/3"
    return result


async def get_json(host: str, port: int, path: str) -> dict:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        data = await reader.read()
    finally:
        writer.close()
    return json.loads(data.split(b"\r\n\r\n", 1)[1])


class InProcess:
    """The in-process reference: descriptions/s of `RewardService.score_jobs` in this process (one torch thread),
    ``merged`` one-description jobs per model call, what the server does when ``merged`` per-sample requests are
    queued together. Measured at the mean batch size the server formed in the scenario it is compared with
    (``merged`` = descriptions / model calls from the server's /health counters), right after that scenario: on a
    shared machine both then run under about the same load."""

    def __init__(self, model_dir: Path, texts: list[str], n: int = 1024):
        from emoreward.export.serve.service import RewardService
        from emoreward.models import load_reward_model

        self.service = RewardService(load_reward_model(model_dir))
        self.jobs = [self.service.parse("rewards", {"descriptions": [t]}) for t in texts[:n]]
        self.rates: list[dict] = []

    def rate(self, merged: int) -> dict:
        import torch

        merged = max(1, int(merged))
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            jobs, score = self.jobs, self.service.score_jobs
            for k in range(0, min(len(jobs), 4 * merged), merged):  # warm-up: this size's shapes
                score(jobs[k : k + merged])
            start, cpu = time.perf_counter(), time.process_time()
            for k in range(0, len(jobs), merged):
                score(jobs[k : k + merged])
            wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        finally:
            torch.set_num_threads(threads)
        self.rates.append({"merged": merged, "descriptions": len(jobs), "wall_s": round(wall, 3),
                           "descriptions_per_s": round(len(jobs) / wall, 1),
                           "descriptions_per_cpu_s": round(len(jobs) / cpu, 1),
                           "load_1min": round(os.getloadavg()[0], 2)})  # fmt: skip
        return self.rates[-1]


async def model_calls(host: str, port: int, replicas: int = 1) -> int:
    """Model calls so far (``stats.batches`` of /health), summed over the replicas (each /health answers from one)."""
    seen: dict[int, int] = {}
    for _ in range(20 * replicas):
        health = await get_json(host, port, "/health")
        seen[int(health.get("replica", 0))] = int(health["stats"]["batches"])
        if len(seen) >= replicas:
            break
    return sum(seen.values())


# ---------------------------------------------------------------------------------------------- the server
def fresh_minilm(directory: Path) -> Path:
    import torch

    from emoreward.models import TextRewardModel

    torch.manual_seed(0)
    TextRewardModel.from_backbone("minilm").save_pretrained(directory)
    return directory


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(
    tree: Path, model: Path, extra: list[str], threads: int | None, replicas: int | None = None
) -> tuple[subprocess.Popen, int]:
    """`emoreward serve` in a subprocess (``replicas``: ``--engine ray`` with that many replicas)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("OMP_NUM_THREADS", None)
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    code = "import sys; from emoreward.cli import main; sys.exit(main(sys.argv[1:]))"
    cmd = [sys.executable, "-c", code, "serve", "--model", str(model), "--port", "0", *extra]
    if replicas:
        cmd[cmd.index("0")] = str(free_port())
        cmd += ["--engine", "ray", "--replicas", str(replicas), "--num-cpus", "1", "--threads", str(threads or 1)]
    # cwd = the tree: `python -c` puts the working directory first on sys.path
    from emoreward.utils.processes import popen_with_parent  # the server ends with this script, even killed

    proc = subprocess.Popen(
        cmd, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **popen_with_parent()
    )
    deadline = time.time() + 180
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        match = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        if match:
            # its output is read as it comes (its last lines kept): a server blocked on a full pipe serves nothing
            proc.tail = collections.deque(maxlen=200)
            proc.reader = threading.Thread(target=lambda: proc.tail.extend(proc.stdout), daemon=True)
            proc.reader.start()
            return proc, int(match.group(1))
    proc.kill()
    raise RuntimeError("the server did not print its address within 180 s")


def stop_server(proc: subprocess.Popen) -> str:
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    proc.reader.join(timeout=10)
    return "".join(proc.tail)


async def run_scenarios(args, texts, proc, port: int, label: str, reference, began: float, results: list) -> None:
    """Every requested scenario against one running server, appended to ``results`` (skipped past the time limit)."""
    host = "127.0.0.1"

    replicas = int(label.split("x")[1]) if label.startswith("ray") else 1

    async def measured(scenario, killed: bool = False) -> None:
        if time.monotonic() - began > args.time_limit:
            scenario.close()
            return
        roles, client, calls = tree_cpu_by_role(proc.pid), time.process_time(), await model_calls(host, port, replicas)
        result = await scenario
        # the clients run in this process, on the same cores as the server: their CPU is reported beside it
        result["client_cpu_s"] = round(time.process_time() - client, 2)
        after = tree_cpu_by_role(proc.pid)
        by_role = {role: round(after[role] - roles.get(role, 0.0), 2) for role in after}
        used = sum(by_role.values())
        # descriptions per second of server CPU: what a dedicated machine would do, whatever else runs here
        # (a killed process takes its CPU time with it: then there is no figure)
        result["server_cpu_s"] = round(used, 2) if used > 0 and not killed else None
        result["server_cpu_by_role"] = by_role
        # the cores the server got (CPU seconds / wall seconds): on a shared machine, what its rate had to work with
        result["server_cores"] = round(used / result["wall_s"], 2) if result["wall_s"] and not killed else None
        result["descriptions_per_server_cpu_s"] = round(result["descriptions"] / used, 1) if used > 0 else None
        result["engine"] = label
        if not killed:
            calls = await model_calls(host, port, replicas) - calls
            result["model_calls"] = calls
            result["descriptions_per_call"] = round(result["descriptions"] / calls, 1) if calls else None
        if reference is not None and result.get("descriptions_per_call"):
            # wall: moves with the machine's other load; CPU: what the server spends per description
            ref = reference.rate(round(result["descriptions_per_call"]))
            result["in_process"] = ref
            result["overhead"] = round(result["descriptions_per_s"] / ref["descriptions_per_s"], 3)
            per_cpu = result["descriptions_per_server_cpu_s"]
            result["overhead_cpu"] = round(per_cpu / ref["descriptions_per_cpu_s"], 3) if per_cpu else None
        results.append(result)

    if args.verl_clients:
        from emoreward.export import verl  # noqa: F401 - imported before any clock starts (it imports torch)
    await throughput(host, port, texts, 1, args.warmup)  # warm up (not reported) ...
    if args.per_sample or args.verl_clients:  # ... also at the load's batch sizes
        await per_sample(host, port, list(texts), max(args.per_sample + args.verl_clients), 2)
    for n in args.throughput_clients:
        await measured(throughput(host, port, texts, n, args.throughput_requests))
    for _ in range(args.repeat):  # each run followed by its in-process reference: paired under the same load
        for n in args.per_sample:
            await measured(per_sample(host, port, list(texts), n, args.requests_per_client))
            if args.slow_clients:
                load = per_sample(host, port, list(texts), n, args.requests_per_client)
                await measured(with_slow_clients(host, port, args.slow_clients, load))
        for n in args.verl_clients:
            await measured(verl_per_sample(f"http://{host}:{port}", texts, n, args.requests_per_client))
    for n in args.batch:
        await measured(batch(host, port, texts, n))
    if args.kill_replica and label.startswith("ray") and label != "ray x1" and args.per_sample:
        n, per = max(args.per_sample), args.requests_per_client
        await measured(killed_replica(host, port, list(texts), n, per, replicas), killed=True)
        for n in args.verl_clients:
            await measured(killed_replica(host, port, list(texts), n, per, replicas, verl=True), killed=True)


def median(values: list) -> float | None:
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else round((values[mid - 1] + values[mid]) / 2, 3)


def medians(results: list[dict]) -> dict[str, dict[str, list]]:
    """The server / in-process ratios of every run, by engine and scenario."""
    out: dict[str, dict[str, list]] = {}
    for r in results:
        if "overhead" in r:
            runs = out.setdefault(f"{r['engine']} {r['scenario']}", {"overhead": [], "overhead_cpu": []})
            runs["overhead"].append(r["overhead"])
            runs["overhead_cpu"].append(r["overhead_cpu"])
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, help="reward-model directory (default: fresh MiniLM value head, seed 0)")
    p.add_argument("--tree", type=Path, default=ROOT, help="checkout whose emoreward the server runs")
    p.add_argument("--texts", choices=["words", "short", "ovmerd"], default="short", help="description set")
    p.add_argument("--per-sample", type=int, nargs="*", default=[64, 256], help="OpenRLHF samples in flight")
    p.add_argument("--requests-per-client", type=int, default=4, help="samples each per-sample client sends")
    p.add_argument("--batch", type=int, nargs="*", default=[1024], help="older OpenRLHF: items in one request")
    p.add_argument("--throughput-clients", type=int, nargs="*", default=[4, 64], help="clients of /v1/rewards")
    p.add_argument("--throughput-requests", type=int, default=20, help="requests each throughput client sends")
    p.add_argument("--verl-clients", type=int, nargs="*", default=[], help="verl reward-loop tasks in flight")
    p.add_argument(
        "--verl-merge", type=int, help="verl client: reward_kwargs merge_samples (1: a request per call; default 16)"
    )
    p.add_argument("--warmup", type=int, default=32, help="requests sent (and not measured) before measuring")
    p.add_argument("--repeat", type=int, default=1, help="runs of each per-sample / verl scenario (median reported)")
    p.add_argument("--threads", type=int, help="OMP_NUM_THREADS of the server (default: torch's, all cores)")
    p.add_argument("--engine", choices=["single", "ray"], default="single", help="emoreward serve --engine")
    p.add_argument("--replicas", type=int, nargs="*", default=[1], help="--engine ray: replica counts to measure")
    p.add_argument("--kill-replica", action="store_true", help="--engine ray: kill a replica under load")
    p.add_argument("--in-process", action="store_true", help="also measure the in-process score rate (overhead)")
    p.add_argument("--time-limit", type=float, default=900.0, help="seconds; scenarios after it are skipped")
    p.add_argument("--server-arg", action="append", default=[], help="extra `emoreward serve` argument")
    p.add_argument("--output", type=Path, help="write the results as JSON")
    p.add_argument(
        "--client",
        choices=["asyncio", "aiohttp"],
        default="asyncio",
        help="per-sample transport: the minimal asyncio client, or aiohttp as OpenRLHF's own (more client CPU)",
    )
    p.add_argument(
        "--slow-clients",
        type=int,
        default=0,
        help="also run each per-sample load beside N clients that send their bodies a byte every 2 s",
    )
    args = p.parse_args()

    sys.path.insert(0, str(ROOT))
    if args.client == "aiohttp":
        CLIENT["post"] = post_aiohttp
    if args.verl_merge is not None:
        VERL_OPTIONS["merge_samples"] = args.verl_merge
    n_texts = 4096
    texts = {"words": word_texts, "short": short_texts, "ovmerd": ovmerd_texts}[args.texts](n_texts)
    began = time.monotonic()
    results, logs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or fresh_minilm(Path(tmp) / "minilm-rm")
        reference = InProcess(model, texts) if args.in_process else None
        for replicas in args.replicas if args.engine == "ray" else [None]:
            proc, port = start_server(args.tree.resolve(), model, args.server_arg, args.threads, replicas)
            label = f"ray x{replicas}" if replicas else "single"
            try:
                asyncio.run(run_scenarios(args, texts, proc, port, label, reference, began, results))
            finally:
                logs.append(stop_server(proc))
    header = {"tree": str(args.tree.resolve()), "texts": args.texts, "server_args": args.server_arg}
    header |= {"engine": args.engine, "threads": args.threads, "cores": os.cpu_count(), "client": args.client}
    header["in_process"] = reference.rates if reference else None
    print(json.dumps(header))
    cols = ["engine", "scenario", "requests", "answered", "lost", "requests_per_s", "descriptions_per_s", "p50_ms"]
    cols += ["p99_ms", "descriptions_per_call", "server_cpu_s", "client_cpu_s", "descriptions_per_server_cpu_s"]
    cols += ["overhead", "overhead_cpu"] if reference else []
    print(" | ".join(cols + ["failed attempts", "load"]).replace("descriptions_per_server_cpu_s", "desc/server-CPU-s"))
    for r in results:
        print(" | ".join(str(r.get(c)) for c in cols) + f" | {r['failed_attempts'] or '-'} | {r['load_1min']}")
    for r in results:
        print(f"{r['engine']} {r['scenario']}: server CPU by process {r['server_cpu_by_role']}")
    for scenario in {r["scenario"] for r in results if r["engine"].startswith("ray x")}:
        runs = {r["engine"]: r for r in results if r["scenario"] == scenario}
        if "ray x1" in runs and "ray x2" in runs:
            one, two = runs["ray x1"], runs["ray x2"]
            print(f"ray x2 / x1, {scenario}: {two['descriptions_per_s'] / one['descriptions_per_s']:.2f} "
                  f"(the server had {one['server_cores']} then {two['server_cores']} cores)")  # fmt: skip
    if reference:
        for key, runs in medians(results).items():
            print(f"median over {len(runs['overhead'])} runs, {key}: server / in-process rate {median(runs['overhead'])}"
                  f" (wall), {median(runs['overhead_cpu'])} (per CPU-second)")  # fmt: skip
    for log in logs:
        print("server output (last lines):\n" + "\n".join(log.strip().splitlines()[-4:]))
    if args.output:
        args.output.write_text(json.dumps({**header, "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
