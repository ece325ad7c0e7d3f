"""A trained judge (`emoreward.training.judge`: merged weights from the judge recipe's SFT path) served by real vLLM
(the CPU build, `make install-vllm`) on 127.0.0.1 gives the in-process judge's verdicts, and its verdict
probabilities, on the same pairs in both orders.

The judge is a 2-layer Llama (hidden 64, head size 32, which vLLM's CPU attention takes) on a ChatML byte-level BPE
tokenizer, trained by `fit_judge` (10 epochs of SFT on 16 pairs, both orders; the loss on the whole answer,
``completion_only_loss: false``, so that it also writes the answer prefix when it generates). Two routes:

- **the judge YAML** (backend ``openai`` at the server, ``verdict: text``: the OpenAI-compatible backend reads no
  logits, so the verdict is parsed from the greedy answer): the answers equal the in-process judge's answers
  (``transformers-text``, ``verdict: text``) character for character, and the verdicts equal the trained folder's
  own logit verdicts (`judge.yaml`);
- **the logit verdict**: the label continuations' log-probabilities from vLLM (``/v1/completions`` with
  ``prompt_logprobs`` on the token ids the in-process scorer builds), softmaxed over the labels as
  `zero_shot.parsing.verdict_from_logits` does: the same verdicts, and probabilities within 1e-4 (float32 on both
  sides; CPU kernels differ in rounding only).

Marked ``vllm`` and ``slow`` (`make test-vllm`; ``EMOREWARD_REQUIRE_VLLM=1`` fails instead of skipping).
"""

from __future__ import annotations

import http.client
import json
import os
import socket
from pathlib import Path

import numpy as np
import pytest
import yaml
from _helpers import synthetic_pairs
from test_trained_judge import build_chat_model, recipe

from emoreward.export.vllm import VllmServer, chat_model_command


pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = os.environ.get("EMOREWARD_VLLM_PYTHON") or str(ROOT / ".venv-vllm" / "bin" / "python")
if not Path(VLLM_PYTHON).is_file():
    if os.environ.get("EMOREWARD_REQUIRE_VLLM") == "1":
        raise RuntimeError(f"EMOREWARD_REQUIRE_VLLM=1 but vLLM's interpreter {VLLM_PYTHON} does not exist")
    pytest.skip(f"no vLLM environment at {VLLM_PYTHON} (make install-vllm)", allow_module_level=True)

SERVED = "trained-judge"
LABELS = ("1", "2", "tie")
TOLERANCE = 1e-4  # verdict probabilities, float32 on both sides


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, path: str, payload: dict) -> dict:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    conn.request("POST", path, json.dumps(payload), {"Content-Type": "application/json"})
    response = conn.getresponse()
    body = json.loads(response.read())
    conn.close()
    assert response.status == 200, body
    return body


@pytest.fixture(scope="module")
def trained_judge(tmp_path_factory) -> Path:
    from emoreward.training.config import resolve_config
    from emoreward.training.judge import fit_judge
    from emoreward.training.judge_config import JudgeTrainConfig

    tmp = tmp_path_factory.mktemp("vllm-judge")
    base = build_chat_model(tmp / "base", hidden=64, heads=2, kv_heads=1)
    path = recipe(tmp, base, num_train_epochs=10, completion_only_loss=False, bf16=False)
    fit_judge(resolve_config(path, config_class=JudgeTrainConfig), synthetic_pairs(16), tmp / "judge")
    return tmp / "judge"


@pytest.fixture(scope="module")
def judge_server(trained_judge, tmp_path_factory):
    port = free_port()
    command = chat_model_command(trained_judge, port=port, served_model_name=SERVED, python=VLLM_PYTHON)
    log = tmp_path_factory.mktemp("logs") / "vllm-judge.log"
    with VllmServer(trained_judge, python=VLLM_PYTHON, port=port, log=log, start_timeout=400, command=command) as s:
        yield s


def text_judge(folder: Path, out: Path, mllm: dict) -> Path:
    """The trained folder's judge definition with text verdicts and another model section."""
    definition = yaml.safe_load((folder / "judge.yaml").read_text())
    definition.update(verdict="text", prompts=str(folder / "prompts.yaml"), mllm=mllm)
    out.write_text(yaml.safe_dump(definition))
    return out


def test_the_served_trained_judge_gives_the_in_process_verdicts(trained_judge, judge_server, tmp_path):
    from emoreward.evaluation.harness import run_judge
    from zero_shot import load_judge

    pairs = synthetic_pairs(16)
    local = text_judge(
        trained_judge, tmp_path / "local.yaml", {"backend": "transformers-text", "model": str(trained_judge),
                                                 "dtype": "float32", "device": "cpu", "batch_size": 8},
    )  # fmt: skip
    served = text_judge(
        trained_judge, tmp_path / "served.yaml", {"backend": "openai", "model": SERVED,
                                                  "base_url": judge_server.url + "/v1", "api_key_env": None},
    )  # fmt: skip
    judges = {"logits": trained_judge / "judge.yaml", "local": local, "served": served}
    runs = {name: run_judge(load_judge(path), pairs, swap=True, runs=1) for name, path in judges.items()}

    def verdicts(result):
        return [j.verdict.value for order in (result.normal[0], result.swapped[0]) for j in order]

    def answers(result):
        return [j.raw for order in (result.normal[0], result.swapped[0]) for j in order]

    assert answers(runs["served"]) == answers(runs["local"])
    assert verdicts(runs["served"]) == verdicts(runs["local"]) == verdicts(runs["logits"])
    assert "invalid" not in verdicts(runs["served"]) and {"1", "2"} <= set(verdicts(runs["served"]))


def test_the_served_label_logprobs_give_the_in_process_probabilities(trained_judge, judge_server):
    """The logit verdict rebuilt from vLLM's prompt log-probabilities on the in-process scorer's token ids."""
    from transformers import AutoTokenizer

    from emoreward.evaluation.harness import run_judge
    from emoreward.training.judge import judge_prompt
    from zero_shot import load_judge
    from zero_shot.parsing import verdict_from_logits
    from zero_shot.prompts import load_prompts

    pairs = synthetic_pairs(16)
    tokenizer = AutoTokenizer.from_pretrained(trained_judge)
    prompts = load_prompts(str(trained_judge / "prompts.yaml"))
    result = run_judge(load_judge(trained_judge / "judge.yaml"), pairs, swap=True, runs=1)
    worst = 0.0
    for order, judgements in (("normal", result.normal[0]), ("swapped", result.swapped[0])):
        for pair, judgement in zip(pairs, judgements):
            ordered = pair if order == "normal" else pair.swapped()
            prompt, sep = judge_prompt(ordered, prompts, tokenizer)
            prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
            logps = []
            for label in LABELS:  # as `TransformersTextBackend._score` builds the continuations
                full = tokenizer(prompt + sep + label, add_special_tokens=False)["input_ids"]
                if full[: len(prompt_ids)] != prompt_ids:
                    full = prompt_ids + tokenizer(sep + label, add_special_tokens=False)["input_ids"]
                body = {"model": SERVED, "prompt": full, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0}
                scored = post(judge_server.url, "/v1/completions", body)["choices"][0]["prompt_logprobs"]
                logps.append(sum(scored[i][str(full[i])]["logprob"] for i in range(len(prompt_ids), len(full))))
            verdict, probs = verdict_from_logits(logps, LABELS)
            want = (judgement.p_first, judgement.p_second) if order == "normal" else (judgement.p_second,
                                                                                     judgement.p_first)  # fmt: skip
            got = (probs["1"], probs["2"])
            worst = max(worst, *np.abs(np.subtract(got, want)))
            expected = judgement.verdict if order == "normal" else judgement.verdict.swapped()
            assert verdict == expected, (order, pair.sample_id, got, want)
    assert worst <= TOLERANCE, worst
