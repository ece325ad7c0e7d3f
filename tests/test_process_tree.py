"""No process of the project outlives its parent (issue 34, item 2): `emoreward train` killed with SIGKILL while its
cross-validation fold workers train, and `emoreward serve` killed while its model process loads and while it serves,
leave no process alive 5 s later (a process-tree check after each kill), and a killed run's folds are not taken for
finished work; `emoreward judge` killed mid-run leaves none either; a child started from a parent's thread lives while
its parent does."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from test_training_run import tiny_recipe

from emoreward.utils.processes import die_with_parent, parent_identity


pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the process tree from /proc")

CODE = "import sys; from emoreward.cli import main; sys.exit(main(sys.argv[1:]))"


def _env() -> dict:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(sys.path),
        "HF_HUB_OFFLINE": "1",
        "WANDB_MODE": "disabled",
        "OMP_NUM_THREADS": "1",
    }


def descendants(pid: int) -> list[int]:
    """Every living (not zombie) process below ``pid``, from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            parents.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        out += children
        todo += children
    return out


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_for(condition, timeout: float, what: str, proc: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the command ended (status {proc.returncode}) before {what}")
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.05)


def kill_and_check_tree(proc: subprocess.Popen, children: list[int]) -> None:
    """SIGKILL ``proc``; every process it had started must be gone 5 s later."""
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    deadline = time.monotonic() + 5.0
    while any(alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [pid for pid in children if alive(pid)]
    assert not left, [open(f"/proc/{pid}/cmdline").read().replace("\0", " ")[:200] for pid in left]


def test_train_killed_while_its_fold_workers_train_leaves_no_worker_and_no_finished_fold(tiny_bert_dir, tmp_path):
    recipe = tiny_recipe(
        tmp_path, tiny_bert_dir, num_train_epochs=30, per_device_train_batch_size=2, fit_workers=2, save_strategy="no"
    )
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-c", CODE, "train", "--config", str(recipe)],
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        # both workers started and training (their fold folders exist)
        wait_for(lambda: len(descendants(proc.pid)) >= 2, 240, "two fold workers", proc)
        wait_for(lambda: (out / "cv" / "fold1").exists() and (out / "cv" / "fold0").exists(), 240, "folds", proc)
        children = descendants(proc.pid)
        assert len(children) >= 2
        kill_and_check_tree(proc, children)
    finally:
        if proc.poll() is None:
            proc.kill()
    time.sleep(1.0)  # a worker that lived on would finish its fold (30 epochs: minutes) and leave its record
    assert not list(out.glob("cv/fold*/finished.json"))


@pytest.fixture(scope="module")
def tiny_rm(tmp_path_factory, tiny_bert_dir):
    from transformers import AutoTokenizer, BertForSequenceClassification

    from emoreward.models import TextRewardModel, TextSettings

    model = TextRewardModel(
        BertForSequenceClassification.from_pretrained(tiny_bert_dir),
        AutoTokenizer.from_pretrained(tiny_bert_dir),
        TextSettings(backbone="tiny-bert", input_format="pair", max_length=64),
    )
    directory = tmp_path_factory.mktemp("tree") / "rm"
    model.save_pretrained(directory)
    return directory


@pytest.mark.parametrize("stage", ["loading", "serving"])
def test_serve_killed_leaves_no_model_process(tiny_rm, stage):
    proc = subprocess.Popen(
        [sys.executable, "-c", CODE, "serve", "--model", str(tiny_rm), "--port", "0"],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        children = wait_for(lambda: descendants(proc.pid), 120, "the model process", proc)
        if stage == "serving":
            line = ""
            while "http://127.0.0.1:" not in line:
                line = proc.stdout.readline()
                assert line or proc.poll() is None, "the server exited"
            children = descendants(proc.pid)
        assert children
        kill_and_check_tree(proc, children)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_judge_killed_mid_run_leaves_no_process(tmp_path):
    judge = tmp_path / "j.yaml"
    judge.write_text("name: j\nmllm: {backend: scripted, model: m, delay_s: 0.2}\n")
    out = tmp_path / "out"
    argv = ["judge", "--judge", str(judge), "--limit", "20", "--runs", "1", "--no-progress", "--output", str(out)]
    proc = subprocess.Popen(
        [sys.executable, "-c", CODE, *argv],
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for(lambda: list(out.rglob("*.jsonl")), 120, "the first judge call", proc)
        kill_and_check_tree(proc, descendants(proc.pid))  # it starts none; whatever a library started ends too
    finally:
        if proc.poll() is None:
            proc.kill()


def _orphan_probe(parent: tuple[int, bool]) -> None:  # the grandchild of the test below
    die_with_parent(parent)
    time.sleep(60)


def test_a_child_started_from_a_thread_outlives_that_thread_but_not_its_parent(tmp_path):
    """The kernel's parent-death signal follows the parent's thread: a child started from a thread that then ends
    must live on while its parent does (`parent_identity` says which thread), and still end with its parent."""
    script = tmp_path / "parent.py"
    script.write_text(
        "import multiprocessing, sys, threading, time\n"
        "sys.path[:0] = " + repr(sys.path) + "\n"
        "from test_process_tree import _orphan_probe\n"
        "from emoreward.utils.processes import parent_identity\n"
        "if __name__ == '__main__':\n"
        "    ctx = multiprocessing.get_context('spawn')\n"
        "    procs = []\n"
        "    def start():\n"
        "        p = ctx.Process(target=_orphan_probe, args=(parent_identity(),)); p.start(); procs.append(p)\n"
        "    t = threading.Thread(target=start); t.start(); t.join()\n"
        "    start()\n"
        "    print(' '.join(str(p.pid) for p in procs), flush=True)\n"
        "    time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, str(script)], env=_env(), stdout=subprocess.PIPE, text=True)
    try:
        children = [int(pid) for pid in proc.stdout.readline().split()]
        time.sleep(1.5)  # past a watch interval: the child started from the ended thread still lives
        assert all(alive(pid) for pid in children)
        assert parent_identity()[0] == os.getpid()
        kill_and_check_tree(proc, children)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_program_started_with_popen_with_parent_ends_with_its_parent(tmp_path):
    """What the benchmarks use to start `emoreward serve` / `train`: killed with the script, SIGTERM (a server
    answers what it has queued and ends its model process)."""
    script = tmp_path / "parent.py"
    script.write_text(
        "import subprocess, sys, time\n"
        "sys.path[:0] = " + repr(sys.path) + "\n"
        "from emoreward.utils.processes import popen_with_parent\n"
        "child = subprocess.Popen(['sleep', '60'], **popen_with_parent())\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, str(script)], env=_env(), stdout=subprocess.PIPE, text=True)
    try:
        children = [int(proc.stdout.readline())]
        assert alive(children[0])
        kill_and_check_tree(proc, children)
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.ray
@pytest.mark.slow
def test_serve_on_ray_killed_leaves_no_process_of_its_local_cluster(tiny_rm):
    """`emoreward serve --engine ray` starts a local Ray cluster (GCS, raylet, Serve's controller, proxy and
    replicas); Ray ties those to the process that started them: none is alive 5 s after it is killed."""
    pytest.importorskip("ray")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**_env(), "RAY_USAGE_STATS_ENABLED": "0"}
    proc = subprocess.Popen(
        [sys.executable, "-c", CODE, "serve", "--model", str(tiny_rm), "--engine", "ray", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        line = ""
        while f"http://127.0.0.1:{port}" not in line:
            line = proc.stdout.readline()
            assert line or proc.poll() is None, "the server exited"
        children = descendants(proc.pid)
        assert len(children) >= 3  # GCS, raylet, the Serve actors at least
        kill_and_check_tree(proc, children)
    finally:
        if proc.poll() is None:
            proc.kill()


# a stand-in for vLLM's interpreter (the remote peer only): answers GET /v1/models on the --port it is given
VLLM_STAND_IN = """
import http.server, json, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
name = sys.argv[sys.argv.index("--served-model-name") + 1]


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"data": [{"id": name}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def test_a_vllm_server_the_project_started_ends_with_its_killed_parent(tiny_rm, tmp_path):
    """`VllmServer` starts vLLM in a session of its own (a terminal's Ctrl-C must not reach it), so nothing tied it
    to its parent: a killed `rank` or RL worker left the vLLM server running (issue 41). Now it gets SIGTERM."""
    from emoreward.export.hf import export_hf

    export_hf(tiny_rm, tmp_path / "export")
    stand_in = tmp_path / "python"
    stand_in.write_text(f"#!{sys.executable}\n" + VLLM_STAND_IN)
    stand_in.chmod(0o755)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    script = tmp_path / "parent.py"
    script.write_text(
        "import sys, time\n"
        "sys.path[:0] = " + repr(sys.path) + "\n"
        "from emoreward.export.vllm import VllmServer\n"
        f"server = VllmServer({str(tmp_path / 'export')!r}, python={str(stand_in)!r}, port={port}, "
        f"log={str(tmp_path / 'vllm.log')!r}, start_timeout=60)\n"
        "server.start()\n"
        "print(server.process.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, str(script)], env=_env(), stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.strip(), (tmp_path / "vllm.log").read_text() if (tmp_path / "vllm.log").exists() else ""
        children = [int(line)]
        assert alive(children[0])
        kill_and_check_tree(proc, children)
    finally:
        if proc.poll() is None:
            proc.kill()
