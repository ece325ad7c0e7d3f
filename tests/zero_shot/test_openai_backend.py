import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from zero_shot.backends.base import ChatRequest, SamplingConfig
from zero_shot.backends.openai_compat import OpenAIChatBackend


class FakeServer:
    """A local OpenAI-compatible server on 127.0.0.1 that fails in scripted ways before answering."""

    def __init__(self, script):
        self.script = list(script)  # per request: "ok", "500", "429", "400", "slow", "garbage"
        self.requests = []
        self.in_flight = 0
        self.max_in_flight = 0
        lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with lock:
                    outer.requests.append((dict(self.headers), body))
                    action = outer.script.pop(0) if outer.script else "ok"
                    outer.in_flight += 1
                    outer.max_in_flight = max(outer.max_in_flight, outer.in_flight)
                try:
                    if action == "slow":
                        time.sleep(0.6)
                    if action in ("500", "429", "400"):
                        self.send_response(int(action))
                        self.end_headers()
                        self.wfile.write(b'{"error": "scripted"}')
                        return
                    if action == "busy":
                        time.sleep(0.15)
                    payload = (
                        b"not json"
                        if action == "garbage"
                        else json.dumps(
                            {
                                "choices": [
                                    {"message": {"content": f"Answer: {body['messages'][-1]['content'][-1]}"}}
                                ],
                                "usage": {"prompt_tokens": 7, "completion_tokens": 3},
                            }
                        ).encode()
                    )
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass
                finally:
                    with lock:
                        outer.in_flight -= 1

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def _backend(url, **kw):
    kw.setdefault("backoff_s", 0.01)
    kw.setdefault("timeout_s", 2.0)
    return OpenAIChatBackend(url, "judge-model", **kw)


def test_retries_server_errors_with_backoff_and_reads_key_from_env(monkeypatch):
    monkeypatch.setenv("FAKE_JUDGE_KEY", "sk-test")
    with FakeServer(["500", "429", "garbage", "ok"]) as server:
        backend = _backend(server.url, api_key_env="FAKE_JUDGE_KEY", max_retries=3)
        [gen] = backend.generate([ChatRequest("pick 1", seed=5)], SamplingConfig(max_new_tokens=8))
    assert gen.error is None and gen.text == "Answer: 1"
    assert gen.extra["attempts"] == 4 and len(server.requests) == 4
    headers, body = server.requests[-1]
    assert headers["Authorization"] == "Bearer sk-test"
    assert body["seed"] == 5 and body["max_tokens"] == 8 and body["temperature"] == 0.0


def test_gives_up_after_max_retries_and_does_not_retry_client_errors():
    with FakeServer(["500"] * 3 + ["400"]) as server:
        backend = _backend(server.url, max_retries=2)
        [gave_up] = backend.generate([ChatRequest("x")], SamplingConfig())
        [client_error] = backend.generate([ChatRequest("y")], SamplingConfig())
    assert "gave up after 3 attempts" in gave_up.error and "HTTP 500" in gave_up.error
    assert client_error.error.startswith("HTTP 400") and len(server.requests) == 4


def test_timeout_is_retried():
    with FakeServer(["slow", "ok"]) as server:
        backend = _backend(server.url, timeout_s=0.2, max_retries=1)
        [gen] = backend.generate([ChatRequest("2")], SamplingConfig())
    assert gen.error is None and gen.extra["attempts"] == 2


def test_concurrency_limit_and_order():
    with FakeServer(["busy"] * 8) as server:
        backend = _backend(server.url, concurrency=3)
        gens = backend.generate([ChatRequest(str(i)) for i in range(8)], SamplingConfig())
    assert [g.text for g in gens] == [f"Answer: {i}" for i in range(8)]
    assert 1 < server.max_in_flight <= 3


def test_missing_key_is_an_error(monkeypatch):
    monkeypatch.delenv("NO_SUCH_JUDGE_KEY", raising=False)
    with pytest.raises(ValueError, match="NO_SUCH_JUDGE_KEY"):
        OpenAIChatBackend("http://127.0.0.1:9/v1", "m", api_key_env="NO_SUCH_JUDGE_KEY")


# ---------------------------------------------------------------------------------------------- real loopback server
class Loopback:
    """An OpenAI-compatible server on 127.0.0.1 whose answer is `respond(headers, body) -> (status, dict)`."""

    def __init__(self, respond):
        self.requests = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append((dict(self.headers), body))
                status, payload = respond(dict(self.headers), body)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def _answer(text):
    return 200, {"choices": [{"message": {"content": text}}], "usage": {"prompt_tokens": 5, "completion_tokens": 2}}


def _judge_yaml(tmp_path, url, **mllm):
    import yaml

    raw = {
        "name": "served-judge",
        "sampling": {"do_sample": False, "max_new_tokens": 8},
        "mllm": {"backend": "openai", "model": "judge-model", "base_url": url, "max_retries": 1, "backoff_s": 0.01,
                 "timeout_s": 5, "concurrency": 2, **mllm},
    }  # fmt: skip
    path = tmp_path / "served.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _pairs_file(tmp_path):
    from zero_shot.testing import demo_pairs

    path = tmp_path / "pairs.jsonl"
    path.write_text(
        "".join(
            json.dumps({"sample_id": p.sample_id, "description_1": p.description_1,
                        "description_2": p.description_2, "label": p.label}) + "\n"
            for p in demo_pairs()
        )
    )  # fmt: skip
    return path


SECRET = "sk-proj-S3cr3tKeyThatMustNeverBeStored0123"


def test_unauthorized_stops_the_run_with_one_line_and_no_key_anywhere(tmp_path, monkeypatch, capsys):
    from emoreward.cli import main

    def refuse(headers, body):  # what some servers do: echo the key they were given
        return 401, {"error": {"message": f"Incorrect API key provided: {headers['Authorization'][7:]}"}}

    monkeypatch.setenv("SERVED_JUDGE_KEY", SECRET)
    out = tmp_path / "out"
    with Loopback(refuse) as server:
        judge = _judge_yaml(tmp_path, server.url, api_key_env="SERVED_JUDGE_KEY")
        argv = ["judge", "--judge", str(judge), "--data", str(_pairs_file(tmp_path)), "--output", str(out)]
        argv += ["--no-progress"]
        status = main(argv)
    err = capsys.readouterr().err
    assert status == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "HTTP 401" in lines[0] and "Stopped" in lines[0] and "api_key_env" in lines[0]
    assert SECRET not in err and "[REDACTED]" in err
    assert len(server.requests) <= 6  # the first chunk (6 pairs, normal order) only: no retry, no swapped order
    for path in out.rglob("*"):  # nothing written anywhere holds the key
        assert SECRET.encode() not in path.read_bytes()


def test_failed_calls_are_reported_apart_and_exit_non_zero(tmp_path, monkeypatch, capsys):
    from emoreward.cli import main

    def flaky(headers, body):
        prompt = body["messages"][-1]["content"]
        if "Neutral face." in prompt:  # sample s4, both orders: a server error that echoes a token
            return 500, {"error": "overloaded (request by hf_AbCdEfGhIjKlMnOpQrSt)"}
        if "Relaxed and happy." in prompt:  # sample s6: an answer with no verdict
            return _answer("I cannot tell.")
        return _answer("Answer: 1")

    out = tmp_path / "out"
    with Loopback(flaky) as server:
        judge = _judge_yaml(tmp_path, server.url)
        argv = ["judge", "--judge", str(judge), "--data", str(_pairs_file(tmp_path)), "--output", str(out)]
        argv += ["--no-progress"]
        assert main([*argv, "--runs", "1"]) == 1
    captured = capsys.readouterr()
    assert "2 call(s) failed" in captured.err and "retry" in captured.err
    report = json.loads((out / "report.json").read_text())
    per_run = report["strategies"]["S1"]["per_run"]
    assert per_run["failed"]["mean"] == 2 and per_run["unparseable"]["mean"] == 2 and per_run["invalid"]["mean"] == 4
    assert "| 2.00 | 2.00 |" in report["markdown"] and "FAILED" in report["markdown"]
    rows = [json.loads(line) for line in (out / "judgements_S1.jsonl").read_text().splitlines()]
    errors = [r["steps"]["error"] for r in rows if "error" in r["steps"]]
    assert len(errors) == 2 and all("HTTP 500" in e and "hf_" not in e and "[REDACTED]" in e for e in errors)


def test_media_parts_follow_the_flag_as_vllm_takes_them(tmp_path):
    import base64

    from zero_shot.backends.base import MediaInput

    clip, wav = tmp_path / "c1.mp4", tmp_path / "c1.wav"
    clip.write_bytes(b"\x00\x00\x00\x18ftypmp42 not a real clip")  # the server decodes it, not the backend
    wav.write_bytes(b"RIFF....WAVEfmt fake pcm")
    media = MediaInput(video=str(clip), audio=str(wav), sample_id="c1")

    def parts_of(body):
        content = body["messages"][-1]["content"]
        return [c for c in content if c["type"] != "text"], content[-1]

    with Loopback(lambda h, b: _answer("Answer: 2")) as server:
        # Qwen2.5-Omni served by vLLM, flag off: the video and the sample's wav, as base64
        omni = _backend(server.url, modalities=("text", "video", "audio"))
        assert omni.media_kind(media) == "video"
        [gen] = omni.generate([ChatRequest("Which?", media=media)], SamplingConfig())
        assert gen.error is None
        (video_part, audio_part), text = parts_of(server.requests[-1][1])
        assert video_part["type"] == "video_url" and video_part["video_url"]["url"].startswith(
            "data:video/mp4;base64,"
        )
        assert base64.b64decode(video_part["video_url"]["url"].split(",", 1)[1]) == clip.read_bytes()
        assert audio_part == {"type": "input_audio",
                              "input_audio": {"data": base64.b64encode(wav.read_bytes()).decode(), "format": "wav"}}  # fmt: skip
        assert text == {"type": "text", "text": "Which?"} and "mm_processor_kwargs" not in server.requests[-1][1]
        # flag on: the video alone, the server interleaves its own track (vLLM's mm_processor_kwargs)
        omni_on = _backend(server.url, modalities=("text", "video", "audio"), use_audio_in_video=True)
        omni_on.generate([ChatRequest("Which?", media=media)], SamplingConfig())
        parts, _ = parts_of(server.requests[-1][1])
        assert [p["type"] for p in parts] == ["video_url"]
        assert server.requests[-1][1]["mm_processor_kwargs"] == {"use_audio_in_video": True}
        assert omni_on.identity != omni.identity
        # Qwen2.5-VL: frames only; file transport sends file:// URLs for a server with --allowed-local-media-path
        vl = _backend(server.url, modalities=("text", "video"), media_transport="file")
        assert vl.media_kind(media) == "video_frames"
        vl.generate([ChatRequest("Which?", media=media)], SamplingConfig())
        parts, _ = parts_of(server.requests[-1][1])
        assert parts == [{"type": "video_url", "video_url": {"url": clip.resolve().as_uri()}}]
        # the flag off and no wav: an error naming sample and file, before anything is sent
        n = len(server.requests)
        [gen] = omni.generate([ChatRequest("x", media=MediaInput(video=str(clip), sample_id="c1"))], SamplingConfig())
        assert gen.error.startswith("MediaError: sample 'c1'") and "wav" in gen.error and len(server.requests) == n
        # a text-only server refuses media samples with a hint, at prompt time
        from zero_shot.strategies import media_kind

        with pytest.raises(ValueError, match="reads text only"):
            media_kind(_backend(server.url), media)


@pytest.mark.skipif(__import__("importlib").util.find_spec("av") is None, reason="needs PyAV")
def test_audio_only_model_hears_the_video_track_when_flagged(tmp_path):
    import base64
    import io
    import wave

    import numpy as np
    from zs_helpers import voiced, write_clip, write_wav

    from emoreward.data.media import load_audio
    from zero_shot.backends.base import MediaInput

    clip = write_clip(tmp_path / "c1.mp4", seconds=1.0, audio=voiced(1.0))
    wav = write_wav(tmp_path / "c1.wav", seconds=0.5, freq=300.0)
    media = MediaInput(video=str(clip), audio=str(wav), sample_id="c1")
    with Loopback(lambda h, b: _answer("Answer: 1")) as server:
        audio_on = _backend(server.url, modalities=("text", "audio"), use_audio_in_video=True)
        assert audio_on.media_kind(media) == "audio"
        [gen] = audio_on.generate([ChatRequest("x", media=media)], SamplingConfig())
    assert gen.error is None
    [part] = [c for c in server.requests[-1][1]["messages"][-1]["content"] if c["type"] != "text"]
    assert part["type"] == "input_audio" and part["input_audio"]["format"] == "wav"
    with wave.open(io.BytesIO(base64.b64decode(part["input_audio"]["data"]))) as sent:
        assert sent.getframerate() == 16000
        samples = np.frombuffer(sent.readframes(sent.getnframes()), dtype="<i2") / 32767
    track = load_audio("c1", clip, 16000)  # the reward models' decoding of the video's own track
    assert samples.shape == track.shape and np.abs(samples - track).max() < 1e-3


# ---------------------------------------------------------------------------------------------- non-finite answers
def _scored(text, logprob):
    """A chat-completions answer carrying its tokens' log-probabilities (what `"logprobs": true` returns)."""
    status, payload = _answer(text)
    tokens = [{"token": "Answer", "logprob": -0.01, "top_logprobs": []}, {"token": ": 1", "logprob": logprob}]
    payload["choices"][0]["logprobs"] = {"content": tokens}
    return status, payload


@pytest.mark.parametrize("bad", [float("nan"), float("-inf"), None], ids=["nan", "-inf", "null"])
def test_an_answer_with_non_finite_logprobs_is_a_broken_model_never_retried(bad):
    """The server's own JSON (Python's json writes NaN / -Infinity literals; orjson writes null) read by the real
    backend: a broken model, not a failed call, so no retry, and the run stops on it."""
    with Loopback(lambda headers, body: _scored("Answer: 1", bad)) as server:
        [gen] = _backend(server.url, max_retries=3).generate([ChatRequest("pick 1")], SamplingConfig())
        assert len(server.requests) == 1 and server.requests[0][1]["logprobs"] is True
    assert (
        gen.broken_model
        and gen.text == ""
        and "NonFiniteLogitsError: non-finite answer log-probabilities" in gen.error
    )
    with Loopback(lambda headers, body: _scored("Answer: 1", -0.5)) as server:
        [fine] = _backend(server.url, logprobs=False).generate([ChatRequest("pick 1")], SamplingConfig())
        assert "logprobs" not in server.requests[0][1]  # an API that refuses the field is not sent it
    assert fine.error is None and not fine.broken_model and fine.text == "Answer: 1"


def test_a_served_judge_answering_nan_logprobs_stops_the_run_and_caches_nothing(tmp_path, capsys):
    """Through `emoreward judge` against a local server whose answers for one sample carry NaN log-probabilities:
    exit 2, one line naming the judge, the sample and the order, no advice to rerun; that sample's call is not
    cached, so the same command asks the server again and stops again the same way."""
    from emoreward.cli import main

    def respond(headers, body):
        nan = "Neutral face." in body["messages"][-1]["content"]  # sample s4, both orders
        return _scored("Answer: 1", float("nan") if nan else -0.2)

    out = tmp_path / "out"
    with Loopback(respond) as server:
        judge = _judge_yaml(tmp_path, server.url)
        argv = ["judge", "--judge", str(judge), "--data", str(_pairs_file(tmp_path)), "--output", str(out)]
        asked = []
        for _ in range(2):
            assert main([*argv, "--no-progress", "--runs", "1"]) == 2
            err = capsys.readouterr().err
            lines = [line for line in err.strip().splitlines() if "error:" in line]
            assert len(lines) == 1, err
            assert "served-judge/S1: NonFiniteLogitsError: non-finite answer log-probabilities [nan]" in lines[0]
            assert "for sample 's4' (order " in lines[0] and "the model's weights are broken" in lines[0], err
            assert "retry" not in err and "run the same command" not in err and "Traceback" not in err
            asked.append(sum("Neutral face." in body["messages"][-1]["content"] for _, body in server.requests))
    assert asked[0] >= 1 and asked[1] > asked[0]  # never cached: asked again
    assert not (out / "report.json").exists()
