"""verl at scale: the reward loop's 32 executor threads load a local model once (then their calls are batched), the
async variant awaits on one connection pool, several server URLs are used round-robin, a 503's Retry-After is
honoured, and a 10,000-response rollout is split into requests within the server's /health limits."""

import asyncio
import http.server
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import bpe_chat
import numpy as np
import pytest
import torch
from _helpers import assert_same_rewards

import emoreward.export.serve.local as local
import emoreward.export.verl as verl
import emoreward.models.base
from emoreward.export.serve.http import RewardServer
from emoreward.export.serve.protocol import ServerLimits
from emoreward.export.serve.service import RewardService
from emoreward.models.precision import model_precision, reward_tolerance


DESCRIPTIONS = ["She smiles broadly; her voice rises: happy.", "  He is calm.\nThen he frowns, ANGRY!  ", "Sad."]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The tiny chat reward model, saved in float32, and the same model loaded back (what every route loads)."""
    model = bpe_chat.tiny_chat_reward_model(bpe_chat.qwen_like_tokenizer())
    path = tmp_path_factory.mktemp("rm") / "rm"
    model.save_pretrained(path)
    return path, emoreward.models.load_reward_model(path, dtype="float32")


@pytest.fixture(autouse=True)
def fresh_pools(monkeypatch):
    """Each test starts with no loaded local model and no client pools (they are per process)."""
    monkeypatch.setattr(local, "_SHARED", {})
    monkeypatch.setattr(verl, "_CLIENTS", {})
    monkeypatch.setenv("EMOREWARD_DTYPE", "float32")
    yield
    verl.close_pools()


QUICK = ServerLimits(keepalive_timeout=0.5)  # idle keep-alive connections of the client pools end quickly at stop


def test_32_executor_threads_load_the_local_model_once_and_share_model_calls(saved, monkeypatch):
    path, model = saved
    loads = []
    real = emoreward.models.base.load_reward_model  # what the in-process engine of open_reward_model calls

    def counting(*args, **kwargs):
        loads.append(args)
        time.sleep(0.2)  # a slow load: every thread arrives while it runs
        return real(*args, **kwargs)

    monkeypatch.setattr(emoreward.models.base, "load_reward_model", counting)
    texts = [f"{DESCRIPTIONS[k % 3]} {k}" for k in range(32)]
    with ThreadPoolExecutor(32) as pool:  # verl's reward loop: run_in_executor(None, compute_score) per sample
        got = list(pool.map(lambda t: verl.compute_score(solution_str=t, extra_info={}, model=str(path)), texts))
    assert len(loads) == 1
    # keys: (content, path, media root, vllm url, ...)
    (scorer,) = [s for key, s in local._SHARED.items() if key[1:4] == (str(path.resolve()), None, None)]
    assert scorer.service.stats.descriptions == 32 and scorer.service.stats.batches < 32  # calls were merged
    # the threads' calls are merged into batches of another composition (other padding) than one score call: float32
    # rounding differs by about 1e-6 (measured up to 1.07e-6), within the project's float32 bound
    assert_same_rewards([g["score"] for g in got], model.score(texts), torch.float32)


def test_async_variant_on_one_pool_and_urls_round_robin(saved):
    path, model = saved
    with (
        RewardServer(RewardService(model, QUICK), port=0) as a,
        RewardServer(RewardService(model, QUICK), port=0) as b,
    ):

        async def rollout():
            calls = [
                verl.compute_score_async(solution_str=d, extra_info={"subtitle": "Hi."}, server_url=[a.url, b.url])
                for d in DESCRIPTIONS * 4
            ]
            return await asyncio.gather(*calls)

        got = asyncio.run(rollout())
        # the 12 calls of one turn share requests: one per server, 6 samples each
        assert a.service.stats.requests == b.service.stats.requests == 1
        assert a.service.stats.descriptions == b.service.stats.descriptions == 6

        async def one_by_one():
            urls = [a.url, b.url]
            calls = [
                verl.compute_score_async(
                    solution_str=d, extra_info={"subtitle": "Hi."}, server_url=urls, merge_samples=1
                )
                for d in DESCRIPTIONS * 4
            ]
            return await asyncio.gather(*calls)

        alone = asyncio.run(one_by_one())
        assert a.service.stats.requests == b.service.stats.requests == 1 + 6  # a request per call, round-robin
    assert len(verl._CLIENTS) == 1  # one pool for the whole rollout
    expected = model.score(DESCRIPTIONS * 4, ["Hi."] * 12)
    assert_same_rewards([g["score"] for g in got], expected, model_precision(model))  # one batch, two servers
    assert_same_rewards([g["score"] for g in alone], expected, model_precision(model))  # one request a call
    assert verl.server_urls("http://a:1/, http://b:2") == ("http://a:1", "http://b:2")
    with pytest.raises(ValueError, match="not an http"):
        verl.server_urls(["a:1"])


class Scripted(http.server.BaseHTTPRequestHandler):
    """A loopback HTTP stand-in for a server or proxy that answers a fixed script of (status, headers, body)."""

    script: list = []
    seen: list = []

    def do_POST(self):  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers["Content-Length"]))
        status, headers, body = self.script.pop(0)
        self.seen.append(time.monotonic())
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture()
def scripted():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    Scripted.seen = []
    yield httpd, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


OK = (200, {"Content-Type": "application/json"}, json.dumps({"rewards": [0.25], "truncated": [False]}).encode())


def test_concurrent_async_calls_share_requests_and_a_refused_sample_fails_alone(saved):
    _, model = saved
    texts = [f"{DESCRIPTIONS[k % 3]} {k}" for k in range(40)]
    infos = [{"subtitle": "Hi."} for _ in texts]
    infos[7] = {"subtitle": "Hi.", "video": "clip.mp4"}  # a text model refuses media paths (400)
    with RewardServer(RewardService(model, QUICK), port=0) as srv:

        async def rollout():
            calls = [
                verl.compute_score_async(solution_str=t, extra_info=i, server_url=srv.url)
                for t, i in zip(texts, infos)
            ]
            return await asyncio.gather(*calls, return_exceptions=True)

        got = asyncio.run(rollout())
        stats = srv.service.stats
        # 40 calls in at most 16 per request: 14 + 14 + 12; the refused request (0-13) again call by call
        assert (stats.requests, stats.bad_requests) == (2 + 13, 1 + 1)
    assert isinstance(got[7], verl.ServerError) and got[7].status == 400 and "text-only" in str(got[7])
    ok = [k for k in range(40) if k != 7]
    expected = model.score([texts[k] for k in ok], ["Hi."] * len(ok))
    np.testing.assert_allclose([got[k]["score"] for k in ok], expected, atol=reward_tolerance(torch.float32))
    with pytest.raises(ValueError, match="'merge_samples' must be a positive integer, got 0"):
        asyncio.run(verl.compute_score_async(solution_str="Sad.", server_url=srv.url, merge_samples=0))
    # a response that is not text is refused, never scored as the text "None" (every function, before any request)
    with pytest.raises(ValueError, match="solution_str must be a string .*got NoneType"):
        verl.compute_score(solution_str=None, server_url=srv.url)
    with pytest.raises(ValueError, match=r"solution_strs\[1\] must be a string .*got int"):
        verl.compute_score_batch(solution_strs=["Sad.", 123], server_url=srv.url)
    with pytest.raises(ValueError, match="solution_str must be a string"):
        asyncio.run(verl.compute_score_async(solution_str=None, server_url=srv.url))


def test_a_failed_merged_request_fails_every_call_of_it(scripted):
    _, url = scripted
    Scripted.script = [(500, {}, b'{"error": "scoring failed; see the server log"}')]

    async def rollout():
        calls = [verl.compute_score_async(solution_str=t, server_url=url) for t in ("Sad.", "Happy.", "Calm.")]
        return await asyncio.gather(*calls, return_exceptions=True)

    got = asyncio.run(rollout())
    assert len(Scripted.seen) == 1  # one request for the three calls, not retried (the server's own 500)
    assert all(isinstance(g, verl.ServerError) and g.status == 500 for g in got)


def test_retry_after_is_honoured_and_proxy_failures_are_retried(scripted):
    _, url = scripted
    Scripted.script = [(503, {"Retry-After": "2"}, b'{"error": "busy"}'), (500, {}, b"Internal Server Error"), OK]
    assert verl.compute_score(solution_str="Sad.", server_url=url)["score"] == 0.25
    first, second, third = Scripted.seen
    assert second - first >= 1.9  # the Retry-After of 2 s, not the 1 s default
    assert 0.9 <= third - second < 1.9  # a proxy's page (not JSON): 1 s, then retried
    Scripted.script = [(500, {}, b'{"error": "scoring failed; see the server log"}')]
    with pytest.raises(RuntimeError, match="answered 500: .*scoring failed"):  # the server's own failure: raised
        asyncio.run(verl.compute_score_async(solution_str="Sad.", server_url=url))


def test_a_10000_response_rollout_is_split_within_the_server_limits(saved):
    path, model = saved
    n, max_items = 10_000, 512
    texts = [f"{DESCRIPTIONS[k % 3]} {k % 5}" for k in range(n)]
    limits = ServerLimits(max_items=max_items, max_batch_tokens=4096, keepalive_timeout=0.5)
    with RewardServer(RewardService(model, limits), port=0) as srv:
        scores = verl.compute_score_batch(
            data_sources=["emotion"] * n,
            solution_strs=texts,
            ground_truths=[None] * n,
            extra_infos=[{"subtitle": "Hi."}] * n,
            server_url=srv.url,
        )
        assert srv.service.stats.requests == -(-n // max_items)  # 20 requests of at most 512
    unique = sorted(set(texts))
    expected = dict(zip(unique, model.score(unique, ["Hi."] * len(unique))))
    assert_same_rewards([s["score"] for s in scores], [expected[t] for t in texts], "float32")


def test_a_connection_the_server_closed_while_idle_is_replaced_without_a_retry(saved):
    _, model = saved
    with RewardServer(RewardService(model, ServerLimits(keepalive_timeout=0.3)), port=0) as srv:

        async def twice():
            first = await verl.compute_score_async(solution_str="Sad.", server_url=srv.url, retries=1)
            await asyncio.sleep(0.8)  # the server closes the idle keep-alive connection
            return first, await verl.compute_score_async(solution_str="Sad.", server_url=srv.url, retries=1)

        first = verl.compute_score(solution_str="Sad.", server_url=srv.url, retries=1)
        time.sleep(0.8)
        again = verl.compute_score(solution_str="Sad.", server_url=srv.url, retries=1)
        first_async, again_async = asyncio.run(twice())
        assert srv.service.stats.requests == 4
    reward = [
        {k: v for k, v in r.items() if not k.startswith("length/")} for r in (first, again, first_async, again_async)
    ]
    assert reward[0] == reward[1] == reward[2] == reward[3]  # the length monitor's figures follow the stream
    assert [r["length/seen"] for r in (first, again, first_async, again_async)] == sorted(
        r["length/seen"] for r in (first, again, first_async, again_async)
    )
