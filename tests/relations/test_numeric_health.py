"""Relation: numeric health. A NaN or an infinity in a loss, a weight or a reward stops the command with one clear
line (exit 2), or is reported as undefined: it is never saved, served, scored or averaged.

Owners: `emoreward.models.base.check_finite_weights` (every loader; the trainer's checkpoints and last weights, a
trained judge before it is saved), `emoreward.training.trainer.DivergenceGuard` / `divergence_error` (a non-finite
loss or gradient norm of any training: the reward trainer, both judge stages), a model's rewards whatever its
weights: `emoreward.models.base.check_finite_rewards` (every model's `score_info`, the scoring stream); a served
engine's reply: `emoreward.export.reward_client.finite_json` (vLLM's ``/classify``, an emoreward server), the score
cache's read (`ScoreCache`: a non-finite line is refused, never reused), and a local judge's answer logits. A pair
file's numeric fields (TRL's `margin` and `tie`, a numeric label): `emoreward.data.values.is_null` (a NaN is a number
that is not finite, never a missing value; pandas' empty cell is made null where a DataFrame is read)."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _helpers import synthetic_pairs
from _identity_inputs import change_weights, model_copy, table_rows, weights_file, write_table
from test_training_run import tiny_recipe, write_pairs_csv

from emoreward.cli.main import main


COVERS: dict[str, tuple[str, ...]] = {
    "train": ("*", "--train_file"),
    "evaluate": ("--model",),
    "judge": ("--judge",),
    "rank": ("--judge", "--vllm-url"),
    "export": ("--model",),
    "serve": ("--model",),
    "score": ("*",),
    "grpo": ("model",),
    "verl": ("*",),
    "pairwise_grpo": ("judge",),
    "openrlhf_http": ("*",),
    "openrlhf_reward_func": ("*",),
}

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", params=[math.nan, math.inf], ids=["nan", "inf"])
def broken_model(request, lora_dir, tmp_path_factory):
    """A trained LoRA model folder with one adapter value set to NaN / infinity."""
    return change_weights(model_copy(lora_dir, tmp_path_factory.mktemp("broken") / "model"), request.param)


def _refused_line(err: str, model: Path) -> None:
    lines = [line for line in err.strip().splitlines() if "error:" in line]
    assert len(lines) == 1 and "non-finite" in lines[0] and str(model) in lines[0], err
    assert "Traceback" not in err


def _cli(argv, capsys) -> tuple[int, str]:
    rc = main(argv)
    return rc, capsys.readouterr().err


def test_commands_refuse_a_model_with_non_finite_weights(broken_model, tmp_path, capsys):
    pairs = write_pairs_csv(tmp_path / "pairs.csv", synthetic_pairs(4))
    table = write_table(tmp_path / "table.jsonl", table_rows(3))
    commands = {
        "evaluate": ["evaluate", "--model", str(broken_model), "--data", str(pairs), "--output", str(tmp_path / "e.json")],
        "rank": ["rank", "--judge", str(broken_model), "--data", str(table), "--n-boot", "5",
                 "--cache-dir", str(tmp_path / "cache"), "--output", str(tmp_path / "r.json")],
        "export": ["export", "--model", str(broken_model), "--output", str(tmp_path / "export")],
    }  # fmt: skip
    for name, argv in commands.items():
        rc, err = _cli(argv, capsys)
        assert rc == 2, (name, err)
        _refused_line(err, broken_model)
    # nothing was saved, scored into a cache, or exported
    assert not (tmp_path / "e.json").exists() and not (tmp_path / "r.json").exists()
    assert not (tmp_path / "export").exists() and not list(tmp_path.glob(".export*"))
    assert not any(p.stat().st_size for p in (tmp_path / "cache").rglob("*") if p.is_file())


def test_serve_refuses_a_model_with_non_finite_weights(broken_model):
    run = subprocess.run(
        [sys.executable, "-m", "emoreward.cli", "serve", "--model", str(broken_model), "--port", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode != 0
    assert "non-finite" in run.stderr and "Traceback" not in run.stderr, run.stderr[-3000:]


@pytest.mark.parametrize("route", ["score", "grpo", "verl"])
def test_python_routes_refuse_a_model_with_non_finite_weights(route, broken_model):
    from emoreward.export.grpo import EmotionReward
    from emoreward.export.verl import compute_score
    from emoreward.models import load_reward_model
    from emoreward.models.base import NonFiniteError

    routes = {
        "score": lambda: load_reward_model(broken_model).score(["calm"]),
        "grpo": lambda: EmotionReward(broken_model),
        "verl": lambda: compute_score(solution_str="calm and smiling", extra_info={}, model=str(broken_model)),
    }
    with pytest.raises(NonFiniteError, match="non-finite"):
        routes[route]()


@pytest.mark.parametrize(
    ("descriptions", "message"),
    [
        ([float("nan"), "Neutral."], r"descriptions\[0\]: missing description \(nan\)"),
        (["Neutral.", None], r"descriptions\[1\]: missing description \(None\)"),
        (["Neutral.", 3], r"descriptions\[1\]: a description must be text, got int"),
    ],
)
def test_python_scoring_names_a_missing_description_and_reads_a_nan_subtitle_as_none(rm_dir, descriptions, message):
    """A missing description (None, NaN: pandas' empty cell) is one ValueError naming its position, from the one
    first step of every scoring route (`models.base.scoring_inputs`: `score`, and the chunked stream `rank` uses),
    before any model work; a NaN subtitle in a `RewardContext` is no subtitle, as a file's NaN cell is. Before:
    `TypeError: object of type 'float' has no len()` from the scoring internals."""
    import numpy as np

    from emoreward.models import RewardContext, load_reward_model
    from emoreward.models.scoring import score_in_chunks

    model = load_reward_model(rm_dir, dtype="float32")
    with pytest.raises(ValueError, match=message):
        model.score(descriptions, "I did it!")
    with pytest.raises(ValueError, match=message):
        list(score_in_chunks(model, descriptions, [RewardContext(subtitle="I did it!")] * 2))
    texts = ["She smiles and her voice rises: joyful.", "Neutral."]
    assert RewardContext(subtitle=float("nan")) == RewardContext() and RewardContext(subtitle=np.nan).subtitle is None
    assert np.array_equal(model.score(texts, RewardContext(subtitle=float("nan"))), model.score(texts))


NUMERIC_FIELDS = [  # a pair file's numeric fields: (a row around the value, row 1's value, the problem)
    ('{{"chosen": "x y", "rejected": "z", "margin": {v}}}', "null", "margin': expected a finite number, got"),
    ('{{"chosen": "x y", "rejected": "z", "tie": {v}}}', "null", "tie': expected true or false, got"),
    ('{{"name": "v2", "a1": "x y", "a2": "z", "preference": {v}}}', "2", "preference': unknown label"),
]


@pytest.mark.parametrize("row, first, problem", NUMERIC_FIELDS, ids=["margin", "tie", "label"])
def test_train_refuses_a_non_finite_number_in_a_numeric_field_of_the_data(
    row, first, problem, tiny_bert_dir, tmp_path, capsys
):
    """The relation on input data: a NaN in a numeric field of a pair file is refused as an infinity is (one line
    naming file, row and field, exit 2, before any training), never read as a missing value (red team F7: a NaN
    margin trained as margin 0 with exit 0, while 1e400 was refused); a JSON null margin or tie (row 1) is the
    missing value."""
    first = row.format(v=first).replace('"v2"', '"v1"').replace('"x y"', '"x"')
    for value in ("NaN", "Infinity", "1e400"):
        data = tmp_path / "pairs.jsonl"
        data.write_text(first + "\n" + row.format(v=value) + "\n")
        recipe = tiny_recipe(tmp_path, tiny_bert_dir, train_file=str(data), cv_folds=0)
        rc, err = _cli(["train", "--config", str(recipe)], capsys)
        lines = [line for line in err.strip().splitlines() if "error:" in line]
        assert rc == 2 and len(lines) == 1, (value, err)
        assert f"{data}, row 2, field '{problem}" in lines[0], (value, lines)
        assert "Traceback" not in err and not (tmp_path / "out" / "model").exists()


@pytest.mark.parametrize(
    "how",
    ["learning_rate", "poisoned_backbone", "judge_recipe"],
)
def test_train_stops_on_a_non_finite_loss(how, tiny_bert_dir, tmp_path, capsys):
    """A diverging run (learning rate 1e38: weights overflow float32) or a backbone with a NaN weight stops with one
    line, exit 2, and leaves no final model, no finished fold and no report; a judge recipe's (TRL's SFT) as well."""
    backbone = tiny_bert_dir
    extra = {"learning_rate": 1e38, "num_train_epochs": 4, "per_device_train_batch_size": 4}
    if how == "poisoned_backbone":
        backbone = change_weights(model_copy(tiny_bert_dir, tmp_path / "backbone"), math.nan)
        extra = {}
    recipe = tiny_recipe(tmp_path, backbone, save_strategy="steps", save_steps=1, **extra)
    if how == "judge_recipe":
        from test_trained_judge import build_chat_model, write_pairs
        from test_trained_judge import recipe as judge_recipe

        base = build_chat_model(tmp_path / "chat")
        recipe = judge_recipe(
            tmp_path, base, cv_folds=2, learning_rate=1e38, max_grad_norm=0.0, train_file=str(write_pairs(tmp_path))
        )
    rc, err = _cli(["train", "--config", str(recipe)], capsys)
    assert rc == 2, err
    lines = [line for line in err.strip().splitlines() if "error:" in line]
    assert len(lines) == 1 and ("the loss is nan" in lines[0] or "non-finite" in lines[0]), err
    out = tmp_path / "out"
    assert not (out / "model").exists() and not (out / "report.json").exists()
    assert not list(out.glob("cv/fold*/finished.json"))
    for state in out.rglob("trainer_state.json"):  # every step checkpoint kept to resume from is finite
        logged = [e["loss"] for e in json.loads(state.read_text())["log_history"] if "loss" in e]
        assert all(math.isfinite(v) for v in logged)


@pytest.mark.parametrize("scale", [math.nan, math.inf, -math.inf])
def test_grpo_refuses_a_non_finite_scale_before_loading(scale, tmp_path):
    """A NaN or infinite reward weight would make every GRPO reward NaN: refused before the model is read."""
    from emoreward.export.grpo import EmotionReward

    with pytest.raises(ValueError, match="scale must be a finite number"):
        EmotionReward(tmp_path / "no-model-here", scale=scale)


# ---------------------------------------------------------------------------------------------- overflowing rewards
def overflowing_model(source: Path, dst: Path, outcome: str) -> Path:
    """A copy of the tiny BERT reward model `source` whose weights are all finite but whose rewards are not: value
    head weights of 3e38 over pooled features of both signs give NaN (``outcome="nan"``); pooled features held at
    +1 (a zero pooler matrix, bias 20) give +infinity (``"inf"``), for every description."""
    import torch
    from safetensors.torch import load_file, save_file

    path = weights_file(model_copy(source, dst))
    tensors = load_file(str(path))
    tensors["classifier.weight"] = torch.full_like(tensors["classifier.weight"], 3e38)
    if outcome == "inf":
        tensors["bert.pooler.dense.weight"] = torch.zeros_like(tensors["bert.pooler.dense.weight"])
        tensors["bert.pooler.dense.bias"] = torch.full_like(tensors["bert.pooler.dense.bias"], 20.0)
    save_file(tensors, str(path), metadata={"format": "pt"})
    return dst


@pytest.fixture(scope="module", params=["nan", "inf"])
def overflowing(request, rm_dir, tmp_path_factory):
    return overflowing_model(rm_dir, tmp_path_factory.mktemp("overflow") / "model", request.param)


def _non_finite_line(err: str, model: Path) -> None:
    lines = [line for line in err.strip().splitlines() if "error:" in line]
    assert len(lines) == 1 and f"{model}: the model returned a non-finite reward" in lines[0], err
    assert "Traceback" not in err


def test_commands_stop_on_a_model_whose_rewards_overflow(overflowing, tmp_path, capsys):
    """Issue 41 (F1): finite weights, rewards that overflow. `evaluate` exited 0 with a 2-class WAF of 0.00 and null
    rewards (the non-finite differences turned into INVALID verdicts); now every command that scores stops with the
    one line of the model's scoring (`check_finite_rewards`), exit 2, and writes nothing: no report, no judge
    folder, no export, no score-cache line."""
    pairs = write_pairs_csv(tmp_path / "pairs.csv", synthetic_pairs(4))
    table = write_table(tmp_path / "table.jsonl", table_rows(3))
    commands = {
        "evaluate": ["evaluate", "--model", str(overflowing), "--data", str(pairs), "--output", str(tmp_path / "e.json")],
        "judge": ["judge", "--judge", str(overflowing), "--data", str(pairs), "--output", str(tmp_path / "judge")],
        "rank": ["rank", "--judge", str(overflowing), "--data", str(table), "--n-boot", "5",
                 "--cache-dir", str(tmp_path / "cache"), "--output", str(tmp_path / "r.json")],
        "export": ["export", "--model", str(overflowing), "--output", str(tmp_path / "export")],
    }  # fmt: skip
    for name, argv in commands.items():
        rc, err = _cli(argv, capsys)
        assert rc == 2, (name, err)
        _non_finite_line(err, overflowing)
    assert not (tmp_path / "e.json").exists() and not (tmp_path / "r.json").exists()
    assert not list((tmp_path / "judge").rglob("report.*")) if (tmp_path / "judge").exists() else True
    assert not (tmp_path / "export").exists() and not list(tmp_path.glob(".export*"))
    assert not any(p.stat().st_size for p in (tmp_path / "cache").rglob("*") if p.is_file())


def test_python_routes_stop_on_a_model_whose_rewards_overflow(overflowing, monkeypatch):
    """The library and RL routes: `score`, the GRPO reward (it returned [nan, nan]), the pairwise GRPO reward (it
    returned 0.5 for every completion, the verdicts INVALID), verl's local model and OpenRLHF's reward file raise,
    naming the model (in process) or the request field (the routes that score through the server's service)."""
    from emoreward.export.grpo import EmotionReward
    from emoreward.export.pairwise import PairwiseGroupReward
    from emoreward.export.serve import local
    from emoreward.export.serve.reward_func import ENV_MODEL, reward_func
    from emoreward.export.verl import compute_score
    from emoreward.judges import load_judge
    from emoreward.models import load_reward_model
    from emoreward.models.base import NonFiniteRewardError

    monkeypatch.setattr(local, "_SHARED", {})  # batchers of this model's own
    monkeypatch.setenv(ENV_MODEL, str(overflowing))
    completions = ["She smiles.", "He frowns deeply.", "Calm."]
    in_process = {
        "score": lambda: load_reward_model(overflowing).score(completions),
        "grpo": lambda: EmotionReward(overflowing)(prompts=["Describe."] * 3, completions=completions),
        "pairwise_grpo": lambda: PairwiseGroupReward(load_judge(str(overflowing)), length_monitor=False)(
            prompts=["Describe."] * 3, completions=completions
        ),
    }
    for route, call in in_process.items():
        err = _raised(call)
        assert isinstance(err, NonFiniteRewardError), (route, err)
        assert f"{overflowing}: the model returned a non-finite reward" in str(err), (route, err)
    served = {
        "verl": (RuntimeError, lambda: compute_score(solution_str="calm", extra_info={}, model=str(overflowing))),
        "openrlhf_reward_func": (
            ValueError,
            lambda: reward_func(["<|im_start|>user\nhi<|im_end|>calm"], ["<|im_start|>user\nhi<|im_end|>"], None),
        ),
    }
    for route, (kind, call) in served.items():
        err = _raised(call)
        assert isinstance(err, kind), (route, err)
        assert re.search(r"the model returned a non-finite reward for (descriptions|query)\[0\]", str(err)), (
            route,
            err,
        )


def _raised(call) -> Exception | None:
    try:
        call()
    except Exception as err:
        return err
    return None


def test_the_server_answers_a_500_for_a_model_whose_rewards_overflow(overflowing):
    """`emoreward serve`'s default engine (the model in a process of its own, `ModelProcess`): the model's refusal
    crosses the pipe and each route answers 500 naming the field (/v1/rewards, OpenRLHF's /get_reward; verl's
    client then raises); the server goes on and counts the failures."""
    from _helpers import post_json

    from emoreward.export.serve.http import RewardServer
    from emoreward.export.serve.service import RewardService
    from emoreward.export.serve.worker import ModelProcess
    from emoreward.export.verl import close_pools, compute_score

    process = ModelProcess(overflowing)
    try:
        service = RewardService(process.facts, scorer=process.score_info, scorer_alive=process.process.is_alive)
        with RewardServer(service, port=0) as server:
            status, reply = post_json(server.host, server.port, "/v1/rewards", {"descriptions": ["calm", "sad"]})
            assert status == 500 and reply["error"] == "the model returned a non-finite reward for descriptions[0]"
            status, reply = post_json(server.host, server.port, "/get_reward", {"query": ["calm"]})
            assert status == 500 and reply["error"] == "the model returned a non-finite reward for query[0]"
            with pytest.raises(RuntimeError, match="non-finite reward"):
                compute_score(solution_str="calm", server_url=f"http://{server.host}:{server.port}")
            close_pools()
            assert service.stats.failures >= 3 and service.stats.requests == 0
    finally:
        process.close()


# ---------------------------------------------------------------------------------------------- served engines
class StandInEngine:
    """A stand-in for a remote engine (the peer only; the project's client and commands are real): a loopback HTTP
    server that speaks vLLM's ``/v1/models`` and ``/classify`` and emoreward's ``/v1/rewards`` reply formats. The
    reward of an input is ``reward(n)`` for its ``n`` token ids (``/classify``) or words (``/v1/rewards``), written
    with Python's JSON encoder, which writes ``NaN`` as a bare token, as a careless engine does."""

    def __init__(self, served: str, reward):
        import http.server
        import threading

        engine = self
        self.reward, self.scored = reward, 0

        class Handler(http.server.BaseHTTPRequestHandler):
            def _reply(self, payload):
                body = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                self._reply({"data": [{"id": served}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path == "/classify":
                    sizes = [len(ids) for ids in body["input"]]
                    engine.scored += len(sizes)
                    data = [{"index": i, "probs": [engine.reward(n)]} for i, n in enumerate(sizes)]
                    self._reply({"data": data, "usage": {"prompt_tokens": sum(sizes)}})
                else:
                    sizes = [len(d.split()) for d in body["descriptions"]]
                    engine.scored += len(sizes)
                    self._reply({"rewards": [engine.reward(n) for n in sizes], "truncated": [False] * len(sizes)})

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def rm_export(rm_dir, tmp_path_factory):
    from emoreward.export.hf import export_hf

    out = tmp_path_factory.mktemp("nan-engine") / "export"
    export_hf(rm_dir, out)
    return out


def _rank_argv(export, engine, tmp_path, cache):
    table = write_table(tmp_path / "table.jsonl", table_rows(3))
    return ["rank", "--judge", str(export), "--vllm-url", engine.url, "--data", str(table), "--n-boot", "5",
            "--cache-dir", str(cache), "--output", str(tmp_path / "r.json")]  # fmt: skip


def test_rank_through_an_engine_answering_nan_stops_and_caches_nothing(rm_export, tmp_path, capsys):
    """A vLLM endpoint answering NaN rewards: before, `rank` exited 0 with wrong figures and NaN lines in the score
    cache that the rerun reused; now one line naming the endpoint, exit 2, no report, nothing cached."""
    from emoreward.export.vllm import served_name

    engine = StandInEngine(served_name(rm_export), lambda n: math.nan if n > 8 else n / 10)
    try:
        rc, err = _cli(_rank_argv(rm_export, engine, tmp_path, tmp_path / "cache"), capsys)
    finally:
        engine.close()
    assert rc == 2, err
    lines = [line for line in err.strip().splitlines() if "error:" in line]
    assert len(lines) == 1 and "non-finite number (NaN)" in lines[0] and engine.url in lines[0], err
    assert "Traceback" not in err and not (tmp_path / "r.json").exists()
    cached = [p.read_text() for p in (tmp_path / "cache").rglob("*.jsonl")]
    assert not any("NaN" in text or "Infinity" in text for text in cached), cached


def test_a_nan_line_in_the_score_cache_is_refused_on_read_and_scored_again(rm_export, tmp_path, capsys):
    """A cache written before scores were checked holds a NaN line: the rerun refuses it (a warning naming the
    line), asks the engine for that one description again and reports what the first run reported."""
    from emoreward.export.vllm import served_name

    engine = StandInEngine(served_name(rm_export), lambda n: n / 10)
    cache = tmp_path / "cache"
    try:
        assert _cli(_rank_argv(rm_export, engine, tmp_path, cache), capsys)[0] == 0
        first, scored = json.loads((tmp_path / "r.json").read_text()), engine.scored
        (path,) = cache.rglob("scores-*.jsonl")
        lines = path.read_text().splitlines()
        entry = json.loads(lines[1])
        lines[1] = json.dumps({**entry, "score": math.nan})  # Python writes the bare token NaN
        path.write_text("\n".join(lines) + "\n")
        (tmp_path / "r.json").unlink()
        with pytest.warns(UserWarning, match=r"1 line\(s\) with a non-finite score .* refused \(line 2\)"):
            rc, err = _cli(_rank_argv(rm_export, engine, tmp_path, cache), capsys)
    finally:
        engine.close()
    assert rc == 0, err
    assert engine.scored == scored + 1  # only the refused line's description was asked again
    again = json.loads((tmp_path / "r.json").read_text())
    assert (again["ranking"], again["mean_reward"], again["W"]) == (first["ranking"], first["mean_reward"], first["W"])


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_verl_through_a_server_answering_non_finite_rewards_raises(value):
    """The project's own server route (verl's `compute_score` over `reward_client`): a reply holding a NaN or an
    infinity raises `NonFiniteError` naming the server, never a reward."""
    from emoreward.export.verl import close_pools, compute_score, compute_score_batch
    from emoreward.models.base import NonFiniteError

    engine = StandInEngine("unused", lambda n: value if n > 2 else 0.5)
    try:
        assert compute_score(solution_str="calm", server_url=engine.url)["score"] == 0.5
        with pytest.raises(NonFiniteError, match=r"non-finite number \((NaN|Infinity)\)"):
            compute_score_batch(solution_strs=["calm", "very calm and smiling"], server_url=engine.url)
    finally:
        close_pools()
        engine.close()


# ---------------------------------------------------------------------------------------------- hung engines
class HungEngine(StandInEngine):
    """A stand-in vLLM endpoint that answers ``/v1/models`` and never answers ``/classify`` (a hung engine);
    ``posts`` counts the ``/classify`` requests it received."""

    def __init__(self, served: str):
        import threading

        super().__init__(served, lambda n: 0.0)
        self.posts, self.release = 0, threading.Event()
        handler = self.server.RequestHandlerClass
        engine = self

        def hang(handler_self):
            engine.posts += 1
            engine.release.wait(60)

        handler.do_POST = hang

    def close(self):
        self.release.set()
        super().close()


def test_rank_through_a_hung_engine_is_one_error_within_engine_timeout(rm_export, tmp_path, capsys):
    """Issue 41: a hung vLLM endpoint stalled `rank` for about 15 minutes (180 s x 5 attempts, no option). Now
    --engine-timeout bounds the whole wait: one line naming the endpoint and the limit, exit 2, nothing cached."""
    import time

    from emoreward.export.vllm import served_name

    engine = HungEngine(served_name(rm_export))
    try:
        start = time.monotonic()
        rc, err = _cli([*_rank_argv(rm_export, engine, tmp_path, tmp_path / "cache"), "--engine-timeout", "1"], capsys)
        seconds = time.monotonic() - start
    finally:
        engine.close()
    assert rc == 2 and seconds < 20, (rc, seconds, err)
    lines = [line for line in err.strip().splitlines() if "error:" in line]
    assert len(lines) == 1 and f"the engine at {engine.url} gave no answer to /classify within 1 s" in lines[0], err
    assert "--engine-timeout" in lines[0] and "Traceback" not in err
    assert not any(p.stat().st_size for p in (tmp_path / "cache").rglob("*") if p.is_file())


def test_engine_timeout_without_a_served_engine_is_refused(rm_dir, tmp_path, capsys):
    table = write_table(tmp_path / "table.jsonl", table_rows(3))
    rc, err = _cli(["rank", "--judge", str(rm_dir), "--data", str(table), "--engine-timeout", "5",
                    "--output", str(tmp_path / "r.json")], capsys)  # fmt: skip
    assert rc == 2 and "--engine-timeout applies to a served engine: give --vllm-url" in err, err


def test_a_verl_batch_through_a_hung_engine_is_one_error_not_serial_retries(rm_export, monkeypatch):
    """verl's in-process route scoring through vLLM (`model` + `vllm_url`): a batch is several model calls, and each
    waited for the hung engine in turn (dozens of serial retries per batch). Now the first call's wait
    (``$EMOREWARD_ENGINE_TIMEOUT``, the route's field) marks the engine as not answering and the batch is one
    error naming it, within about that time."""
    import time

    from emoreward.export.serve import local
    from emoreward.export.verl import compute_score_batch
    from emoreward.export.vllm import served_name

    monkeypatch.setenv("EMOREWARD_ENGINE_TIMEOUT", "1")
    monkeypatch.setattr(local, "_SHARED", {})  # a batcher of its own (one per process otherwise)
    engine = HungEngine(served_name(rm_export))
    texts = [f"She smiles {k} times and then looks away, calm and quiet {k % 5}." * 4 for k in range(600)]
    try:
        start = time.monotonic()
        with pytest.raises(RuntimeError, match=f"the engine at {engine.url} gave no answer") as caught:
            compute_score_batch(solution_strs=texts, model=str(rm_export), vllm_url=engine.url)
        seconds = time.monotonic() - start
    finally:
        engine.close()
    assert seconds < 10, seconds
    assert "see the server log" not in str(caught.value)
    assert engine.posts <= 8, engine.posts  # the first call's requests in flight; none after it
