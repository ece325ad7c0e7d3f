import json

import pytest

from emoreward.data import MediaRef, PreferencePair
from emoreward.evaluation.harness import run_judge
from zero_shot.cache import CacheMismatchError, CallCache, CallKey
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


def test_resume_after_crash_makes_only_missing_calls_and_gives_the_same_report(tmp_path, fast_random_baseline):
    pairs, refs = demo_pairs(), {p.sample_id: REFERENCE for p in demo_pairs()}
    full = run_zero_shot(
        _config(),
        pairs,
        ["S1", "S4"],
        runs=2,
        references=refs,
        progress=False,
        backends={"mllm": ScriptedBackend()},
        output_dir=tmp_path / "full",
    )
    n_total = full["calls"]["made"]
    assert n_total == 6 * 2 * 2 * (1 + 2)  # pairs x orders x runs x (S1 + S4's two steps)

    out = tmp_path / "crashed"
    with pytest.raises(KeyboardInterrupt):
        run_zero_shot(
            _config(),
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
        _config(),
        pairs,
        ["S1", "S4"],
        runs=2,
        references=refs,
        progress=False,
        backends={"mllm": resumed_backend},
        output_dir=out,
    )
    assert len(resumed_backend.calls) == n_total - len(lines)
    assert resumed["calls"]["cached"] == len(lines)
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
        _config(),
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
        _config(),
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


def test_cache_refuses_a_changed_input(tmp_path):
    cache = CallCache(tmp_path / "c.jsonl")
    key = CallKey("j", "S1", "compare", "s1", "normal", 0)
    cache.put(key, "hash-a", "Answer: 1")
    assert CallCache(tmp_path / "c.jsonl").get(key, "hash-a")["output"] == "Answer: 1"
    with pytest.raises(CacheMismatchError, match="fresh output folder"):
        CallCache(tmp_path / "c.jsonl").get(key, "hash-b")
