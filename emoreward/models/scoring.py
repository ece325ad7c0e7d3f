"""The scoring engine of text reward models: one loop from descriptions to rewards for every route (chunks in
order of length, tokenised ahead in a background thread, length-sorted batches under a token budget, one forward
per batch). `score_in_chunks` gives the same per-chunk stream for any `RewardModel`. See docs/ranking.md and
docs/speed.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np

from emoreward.models.base import RewardContext, ScoreInfo, check_finite_rewards, scoring_inputs


if TYPE_CHECKING:
    from emoreward.models.base import RewardModel


DEFAULT_CHUNK_SIZE = 512


def plan_batches(
    lengths: Sequence[int], batch_size: int, max_batch_tokens: int, pad_to_multiple_of: int = 1
) -> list[tuple[np.ndarray, int]]:
    """Length-sorted batches: sequences sorted by length (stable), each batch at most `batch_size` rows and
    `max_batch_tokens` padded tokens (rows x width), the width (the batch's longest sequence) rounded up to
    `pad_to_multiple_of`; a sequence longer than the budget runs alone.

    Returns:
        `[(indices into lengths, padded width), ...]` in the order they run.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    order = np.argsort(lengths, kind="stable")
    widths = -(-lengths // pad_to_multiple_of) * pad_to_multiple_of
    batches, start = [], 0
    while start < len(order):
        stop = start + 1  # a sequence longer than the budget still runs, alone
        while (
            stop < len(order)
            and stop - start < batch_size
            and (stop - start + 1) * widths[order[stop]] <= max_batch_tokens
        ):
            stop += 1
        idx = order[start:stop]
        batches.append((idx, int(widths[idx[-1]])))
        start = stop
    return batches


def run_batches(
    plan: Sequence[tuple[np.ndarray, int]], forward: Callable[[np.ndarray, int], None], workers: int = 1
) -> None:
    """Run `forward(indices, width)` for every batch of a plan, under `torch.inference_mode`: in order on this thread
    (`workers` 1), or on `workers` threads that each run whole batches with one torch thread (on a CPU, no fork and
    join per operation). This thread's torch thread count is unchanged afterwards.

    Raises:
        whatever `forward` raises (the first; batches not started by then are not run)."""
    import torch

    def run(batch: tuple[np.ndarray, int]) -> None:
        with torch.inference_mode():
            forward(*batch)

    if workers <= 1 or len(plan) < 2:
        for batch in plan:
            run(batch)
        return
    threads = torch.get_num_threads()
    pool = ThreadPoolExecutor(min(workers, len(plan)), "emoreward-score", torch.set_num_threads, (1,))
    try:
        for future in [pool.submit(run, batch) for batch in plan]:
            future.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # after an error or an interrupt, no new batch starts
        torch.set_num_threads(threads)  # the workers set the process default to 1; this thread keeps its own


def length_chunks(lengths: Sequence[int], chunk_size: int = DEFAULT_CHUNK_SIZE) -> list[np.ndarray]:
    """Indices in order of `lengths` (stable), cut into consecutive chunks of at most `chunk_size`.

    Raises:
        ValueError: if ``chunk_size < 1``."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    order = np.argsort(np.asarray(lengths, dtype=np.int64), kind="stable")
    return [order[begin : begin + chunk_size] for begin in range(0, len(order), chunk_size)]


def character_lengths(descriptions: Sequence[str], contexts: Sequence[RewardContext]) -> list[int]:
    """Characters of each description and its subtitle: the length proxy `length_chunks` orders text by."""
    return [len(d) + len(c.subtitle or "") for d, c in zip(descriptions, contexts)]


def stream_scores(
    model: Any,
    descriptions: Sequence[str],
    contexts: Sequence[RewardContext | None] | RewardContext | None = None,
    *,
    batch_size: int | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> Iterator[tuple[np.ndarray, ScoreInfo]]:
    """A text reward model's rewards chunk by chunk (`TextRewardModel.score_stream`): chunks in order of length,
    tokenised ahead in a background thread, scored in length-sorted batches.

    Yields:
        `(indices, info)`: positions in `descriptions` and their `CoverageScoreInfo`; every position exactly once.

    Raises:
        ValueError: a missing or non-text description, or bad contexts (`base.scoring_inputs`, before any model
            work); from tokenisation (e.g. no room for the description), when that chunk's turn comes."""
    descriptions, contexts = scoring_inputs(descriptions, contexts)
    chunks = length_chunks(character_lengths(descriptions, contexts), chunk_size)
    if not chunks:
        return

    def tokenise(idx: np.ndarray):
        return model.encode_batch([descriptions[i] for i in idx], [contexts[i] for i in idx])

    if len(chunks) == 1:  # nothing to overlap with but building the network: no thread
        encoded = tokenise(chunks[0])
        yield chunks[0], model.score_encoded(encoded, [descriptions[i] for i in chunks[0]], batch_size=batch_size)
        return
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="emoreward-tokenise")
    try:
        pending = [pool.submit(tokenise, idx) for idx in chunks]  # one worker: in order, ahead of the scoring
        _ = model.scoring_engine  # build the scoring network (and its fast forward) while the first chunk tokenises
        for idx, future in zip(chunks, pending):
            info = model.score_encoded(future.result(), [descriptions[i] for i in idx], batch_size=batch_size)
            yield idx, info
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def score_in_chunks(
    model: RewardModel,
    descriptions: Sequence[str],
    contexts: Sequence[RewardContext],
    *,
    batch_size: int | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> Iterator[tuple[np.ndarray, ScoreInfo]]:
    """Any reward model's rewards chunk by chunk: its own `score_stream` where it has one, else its `score_info` on
    chunks of at most `chunk_size` descriptions (text in order of length; a multimodal model's grouped by context).

    Yields:
        `(indices, info)`: positions in `descriptions` and their `ScoreInfo`; every position exactly once.

    Raises:
        ValueError: if ``chunk_size < 1``; whatever the model's scoring raises (e.g. `MediaError`).
        NonFiniteRewardError: a chunk's reward is NaN or infinite (`check_finite_rewards`, as `score_info`; the
            chunks before it have been yielded)."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    contexts = list(contexts)
    stream = getattr(model, "score_stream", None)
    if stream is not None:
        for idx, info in stream(descriptions, contexts, batch_size=batch_size, chunk_size=chunk_size):
            check_finite_rewards(
                model, info.rewards, [descriptions[i] for i in idx], [contexts[i] for i in idx], positions=idx
            )
            yield idx, info
        return
    if model.kind == "media":
        groups: dict[Any, list[int]] = {}
        for i, context in enumerate(contexts):
            groups.setdefault(model.context_key(context), []).append(i)
        chunks: list[list[int]] = []
        for group in groups.values():
            for begin in range(0, len(group), chunk_size):
                piece = group[begin : begin + chunk_size]
                if chunks and len(chunks[-1]) + len(piece) <= chunk_size:
                    chunks[-1].extend(piece)
                else:
                    chunks.append(list(piece))
        pieces = [np.asarray(c, dtype=np.int64) for c in chunks]
    else:
        pieces = length_chunks(character_lengths(descriptions, contexts), chunk_size)
    for idx in pieces:
        yield idx, model.score_info([descriptions[i] for i in idx], [contexts[i] for i in idx], batch_size=batch_size)


__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "character_lengths",
    "length_chunks",
    "plan_batches",
    "run_batches",
    "score_in_chunks",
    "stream_scores",
]
