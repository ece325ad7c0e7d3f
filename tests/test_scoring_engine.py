"""The text scoring engine (`emoreward.models.scoring`) and its BERT fast forward (`emoreward.models.packed`): the
same rewards as the network's own forward on one description at a time (float32 within 1e-6, bfloat16 within
`reward_tolerance`), whatever the batching, the chunking, the padded width or the filler rows; order, truncation
flags, token counts and unknown-token shares preserved; the batched layout equal to the one-at-a-time layout; an
error in the tokeniser thread raised in the caller after the chunks before it; freed memory kept for reuse."""

from __future__ import annotations

import platform
import resource
import threading
import time

import numpy as np
import pytest
import torch

from emoreward.models.base import RewardContext
from emoreward.models.coverage import unknown_token_share
from emoreward.models.layout import text_input_ids, text_input_ids_batch
from emoreward.models.packed import PackedEncoder, packed_encoder
from emoreward.models.precision import reward_tolerance
from emoreward.models.scoring import plan_batches, run_batches
from emoreward.models.text import TextRewardModel
from emoreward.utils.allocator import keep_freed_memory


WORDS = "she smiles then frowns her voice trembles with joy anger and calm relief".split()
SUBTITLES = [None, "oh no", "I can't believe it!", None, "très bien"]


def texts(n: int = 23, seed: int = 0) -> list[str]:
    """Descriptions of 0 to 60 words (the longest cut at the test model's 64 tokens), one empty, one repeated."""
    rng = np.random.default_rng(seed)
    out = [" ".join(rng.choice(WORDS, size=int(k))) for k in rng.integers(1, 60, size=n - 2)]
    return out + ["", out[3]]


def alone(model: TextRewardModel, sequences) -> np.ndarray:
    """The reference: the scoring network's own `forward` on each sequence alone (no padding)."""
    network = model.scoring_network
    with torch.inference_mode():
        return np.array([float(network(input_ids=torch.tensor([s])).logits[0, 0]) for s in sequences])


def bound(dtype: torch.dtype, rewards: np.ndarray) -> float:
    return reward_tolerance(dtype, magnitude=float(np.abs(rewards).max()))  # "the same reward", on every CPU kind


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fast_forward_equals_the_networks_own_forward_alone(lora_dir, dtype):
    model = TextRewardModel.from_pretrained(lora_dir, dtype=dtype)
    assert isinstance(model.scoring_engine, PackedEncoder)  # a BERT classifier on CPU: the fast forward
    contexts = [RewardContext(subtitle=SUBTITLES[i % len(SUBTITLES)]) for i in range(23)]
    sequences = [e.input_ids for e in model.encode_batch(texts(), contexts)]
    want = alone(model, sequences)
    tol = bound(dtype, want)
    # batch sizes, token budgets and padded widths of every kind: equal lengths (no mask), one row, rounded widths
    for batch_size, budget, multiple in [(32, None, None), (1, None, None), (5, 200, 1), (8, 10_000, 16), (3, 64, 7)]:
        got = model.score_ids(sequences, batch_size=batch_size, max_batch_tokens=budget, pad_to_multiple_of=multiple)
        np.testing.assert_allclose(got, want, atol=tol, rtol=0)
    same = [sequences[0]] * 4  # a batch of equal lengths: no attention mask
    np.testing.assert_allclose(model.score_ids(same), want[[0] * 4], atol=tol, rtol=0)
    for rows in (1, 64, 1000):  # filler token rows (any count) change nothing
        engine = PackedEncoder(model.scoring_network, row_multiple=rows)
        with torch.inference_mode():
            got = engine(sequences[:6])[:, 0].float().numpy()
        np.testing.assert_allclose(got, want[:6], atol=tol, rtol=0)


def test_networks_the_fast_forward_does_not_reproduce_run_their_own(lora_dir, tiny_llama_dir):
    reference = TextRewardModel.from_pretrained(lora_dir, dtype=None)  # the live adapter: the exact reference path
    assert reference.scoring_engine is None
    assert packed_encoder(reference.model) is None  # a peft model
    decoder = TextRewardModel.from_backbone(str(tiny_llama_dir), max_length=64)
    assert packed_encoder(decoder.model.eval()) is None  # not a BERT classifier
    fast = TextRewardModel.from_pretrained(lora_dir, dtype="float32")
    assert packed_encoder(fast.scoring_network.train()) is None  # not in eval mode
    fast.scoring_network.eval()
    descriptions = texts()
    np.testing.assert_allclose(fast.score(descriptions), reference.score(descriptions), atol=1e-5, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_engine_scores_like_one_description_at_a_time(lora_dir, dtype):
    """Chunks of 4 (so the background thread tokenises ahead), in order of length: every description once, its
    reward, flag, token count and unknown share where it belongs, as if scored alone."""
    model = TextRewardModel.from_pretrained(lora_dir, dtype=dtype)
    descriptions = texts()
    contexts = [RewardContext(subtitle=SUBTITLES[i % len(SUBTITLES)]) for i in range(len(descriptions))]
    parts = list(model.score_stream(descriptions, contexts, chunk_size=4))
    assert [len(idx) for idx, _ in parts] == [4] * 5 + [3]
    assert sorted(int(i) for idx, _ in parts for i in idx) == list(range(len(descriptions)))
    one = [model.score_info([d], [c]) for d, c in zip(descriptions, contexts)]
    want = np.array([o.rewards[0] for o in one])
    whole = model.score_info(descriptions, contexts)  # the parts put back in order
    np.testing.assert_allclose(whole.rewards, want, atol=bound(dtype, want), rtol=0)
    encoded = [model.encode(d, c) for d, c in zip(descriptions, contexts)]
    np.testing.assert_array_equal(whole.truncated, [e.truncated for e in encoded])
    assert whole.truncated.sum() >= 2  # some descriptions are cut at 64 tokens
    np.testing.assert_array_equal(whole.n_tokens, [len(e.input_ids) for e in encoded])
    np.testing.assert_allclose(whole.unknown_share, unknown_token_share(model.tokenizer, descriptions), atol=0)
    for idx, info in parts:  # chunks of 4 batch differently from one chunk: float rounding only
        np.testing.assert_allclose(info.rewards, whole.rewards[idx], atol=bound(dtype, want), rtol=0)
    # the reference path (live adapter, the network's own forward) agrees at the cross-path bound
    reference = TextRewardModel.from_pretrained(lora_dir, dtype=None).score_info(descriptions, contexts)
    tol = reward_tolerance(dtype, torch.float32, magnitude=float(np.abs(want).max()))
    np.testing.assert_allclose(whole.rewards, reference.rewards, atol=tol, rtol=0)


def test_a_tokeniser_error_is_raised_in_the_caller_after_the_chunks_before_it(lora_dir):
    model = TextRewardModel.from_pretrained(lora_dir, dtype="float32")
    descriptions = [f"she smiles {'a' * k}" for k in range(12)]  # longer and longer: chunks in this order
    long_subtitle = " ".join(["word"] * 80)  # 80 tokens of context: no room left within 64
    contexts = [RewardContext()] * 11 + [RewardContext(subtitle=long_subtitle)]
    got = []
    with pytest.raises(ValueError, match="leaves no room for the description"):
        for idx, _ in model.score_stream(descriptions, contexts, chunk_size=4):
            got.append(idx)
    assert [list(map(int, idx)) for idx in got] == [[0, 1, 2, 3], [4, 5, 6, 7]]  # the chunks before it came out
    deadline = time.monotonic() + 5
    while any(t.name.startswith("emoreward-tokenise") for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(t.name.startswith("emoreward-tokenise") for t in threading.enumerate())  # the thread is gone
    with pytest.raises(ValueError, match="leaves no room"):
        model.score_info(descriptions, contexts)


def test_batches_side_by_side_give_the_same_rewards_and_keep_the_thread_count(lora_dir):
    model = TextRewardModel.from_pretrained(lora_dir, dtype="float32")
    sequences = [e.input_ids for e in model.encode_batch(texts(), [None] * 23)]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one_thread = model.score_ids(sequences, batch_size=3)  # one batch after the other
        torch.set_num_threads(2)
        side_by_side = model.score_ids(sequences, batch_size=3)  # two workers, one torch thread each
        assert torch.get_num_threads() == 2  # the caller's thread count is unchanged
    finally:
        torch.set_num_threads(threads)
    np.testing.assert_allclose(side_by_side, one_thread, atol=1e-6, rtol=0)
    np.testing.assert_allclose(side_by_side, alone(model, sequences), atol=1e-6, rtol=0)


def test_an_error_in_a_batch_stops_the_batches_not_started():
    plan = plan_batches([5] * 40, batch_size=1, max_batch_tokens=100)  # 40 batches
    ran = []

    def forward(idx, width):
        ran.append(int(idx[0]))
        if len(ran) == 3:
            raise RuntimeError("batch 3 failed")
        time.sleep(0.01)

    with pytest.raises(RuntimeError, match="batch 3 failed"):
        run_batches(plan, forward, workers=2)
    assert 3 <= len(ran) < 40


@pytest.mark.parametrize("fixture", ["tiny_bert_dir", "tiny_llama_dir"])
def test_the_batched_layout_is_the_one_at_a_time_layout(fixture, request):
    model = TextRewardModel.from_backbone(str(request.getfixturevalue(fixture)), max_length=72)
    descriptions = texts() + ["  leading and trailing spaces  ", "\n", "she smiles " * 50]
    subtitles = [SUBTITLES[i % len(SUBTITLES)] for i in range(len(descriptions))]
    for truncate in (True, False):
        batch = text_input_ids_batch(model.tokenizer, model.settings, descriptions, subtitles, truncate=truncate)
        one = [
            text_input_ids(model.tokenizer, model.settings, d, s, truncate=truncate)
            for d, s in zip(descriptions, subtitles)
        ]
        assert [(b.input_ids, b.truncated) for b in batch] == [(o.input_ids, o.truncated) for o in one]
        assert any(b.truncated for b in batch)
    with pytest.raises(ValueError, match="2 descriptions but 1 subtitles"):
        text_input_ids_batch(model.tokenizer, model.settings, ["a", "b"], [None])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's allocator settings")
def test_freed_memory_is_kept_for_the_next_batch():
    """A forward pass's activations (MiniLM-sized, 2,048 tokens, float32: 3-12 MiB each) reuse the memory the
    pass before freed: few fresh pages. glibc's default gives them back and faults them in again (9,184 of the
    25,000 pages here; 3,072 with the setting)."""
    assert keep_freed_memory() is True and keep_freed_memory() is True  # applied once, stays on
    g = torch.Generator().manual_seed(0)
    up, down = torch.randn(1536, 384, generator=g), torch.randn(384, 1536, generator=g)

    def forward(x):
        for _ in range(3):
            x = torch.nn.functional.layer_norm(
                torch.nn.functional.linear(torch.nn.functional.gelu(x @ up.T), down) + x, (384,)
            )
        return x

    x = torch.randn(2048, 384, generator=g)
    with torch.inference_mode():
        forward(x)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        forward(x)
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    pages = 3 * (2 * 2048 * 1536 + 3 * 2048 * 384) * 4 // 4096  # what the pass allocates, in 4 KiB pages
    assert faults < pages / 4
