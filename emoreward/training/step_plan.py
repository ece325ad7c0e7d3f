"""The step plan: every choice that changes how many collective operations a training step runs, made once for
all processes (`plan_forward_groups`, `gather_reward_metrics`), so no DDP rank waits on a collective another skips.
See docs/training.md.
"""

from __future__ import annotations

import torch


def split_by_length(
    lengths, max_groups: int = 3, overhead_tokens: int = 64, *, groups: int | None = None, multiple: int = 1
) -> list[list[int]]:
    """Groups of sequence indices (shortest group first) that waste the least compute on padding: `lengths` (shape
    `(n,)`) sorted and cut into at most `max_groups` runs (exactly `groups` when given), each padded to
    `padded_width`, minimising padded tokens plus `overhead_tokens` per extra forward pass (dynamic programming)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    sorted_len = [padded_width(lengths[i], multiple) for i in order]
    n = len(order)
    top = max(max_groups, groups or 0)
    inf = float("inf")
    # best[g][j]: least cost of the first j sequences in g groups; a group i..j-1 costs (j - i) * sorted_len[j - 1]
    best = [[inf] * (n + 1) for _ in range(top + 1)]
    cut = [[0] * (n + 1) for _ in range(top + 1)]
    best[0][0] = 0.0
    for g in range(1, top + 1):
        for j in range(1, n + 1):
            for i in range(g - 1, j):
                cost = best[g - 1][i] + (j - i) * sorted_len[j - 1] + overhead_tokens
                if cost < best[g][j]:
                    best[g][j], cut[g][j] = cost, i
    if not n:
        return []
    count = groups if groups is not None else min(range(1, max_groups + 1), key=lambda g: best[g][n])
    if not 1 <= count <= n:
        raise ValueError(f"cannot split {n} sequences into {count} groups")
    bounds, j = [], n
    for g in range(count, 0, -1):
        bounds.append((cut[g][j], j))
        j = cut[g][j]
    return [order[i:j] for i, j in reversed(bounds)]


def padded_width(longest: int, multiple: int = 1) -> int:
    """The width a group of sequences is padded to: its longest, rounded up to `multiple` (None or 1: the longest)."""
    multiple = max(1, int(multiple or 1))
    return -(-int(longest) // multiple) * multiple


def agreed_group_count(proposals: list[int], sizes: list[int]) -> int:
    """The one number of forward passes every process runs: the largest of the processes' `proposals`, capped by the
    smallest batch in `sizes` (a group is never empty)."""
    return max(1, min(max(proposals), min(sizes)))


def _world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def plan_forward_groups(lengths: list[int], max_groups: int, *, multiple: int = 1, device=None) -> list[list[int]]:
    """This process's length groups for one step, as many as on every other process (one all-reduce under a
    multi-process launch); every process must call it once per step.

    Args:
        lengths: `(2 * batch,)` real token counts of this process's chosen and rejected sequences.
        max_groups: at most this many forward passes (< 2: one pass).
        multiple: each group's width is rounded up to this (`padded_width`).
        device: where the all-reduce tensor lives (the batch's device).

    Returns:
        index lists into `lengths` (see `split_by_length`)."""
    n = len(lengths)
    proposal = (
        len(split_by_length(lengths, max(1, max_groups), multiple=multiple)) if n >= 2 and max_groups >= 2 else 1
    )
    if _world_size() > 1:
        import torch.distributed as dist

        # one collective: the max of the proposals and (negated) the min of the sizes
        both = torch.tensor([proposal, -n], dtype=torch.long, device=device)
        dist.all_reduce(both, op=dist.ReduceOp.MAX)
        count = agreed_group_count([int(both[0])], [-int(both[1])])
    else:
        count = agreed_group_count([proposal], [n])
    if count <= 1 or n == 0:
        return [list(range(n))]
    return split_by_length(lengths, max_groups, groups=count, multiple=multiple)


def gather_reward_metrics(accelerator, chosen: torch.Tensor, rejected: torch.Tensor, tie: torch.Tensor | None) -> dict:
    """TRL's reward metrics over all processes, from gathers that run every step whatever the batch holds.

    Args:
        accelerator: the trainer's `accelerate.Accelerator`.
        chosen, rejected: `(batch,)` rewards of this process's pairs; tie: `(batch,)` 1.0 for tie pairs, or None.

    Returns:
        `{"min_reward", "mean_reward", "max_reward"}` and `"accuracy"` / `"margin"` over the decided pairs of all
        processes (None when there is none)."""
    with torch.no_grad():
        rewards = accelerator.gather(torch.cat([chosen, rejected]).detach().float())
        decided = torch.ones_like(chosen, dtype=torch.bool) if tie is None else tie < 0.5
        diff = (chosen - rejected).detach().float()
        local = torch.stack(
            [decided.sum().float(), ((diff > 0) & decided).sum().float(), torch.where(decided, diff, 0.0).sum()]
        )
        n, correct, margin = accelerator.gather(local.unsqueeze(0)).sum(0).tolist()
    return {
        "min_reward": rewards.min().item(),
        "mean_reward": rewards.mean().item(),
        "max_reward": rewards.max().item(),
        "accuracy": correct / n if n else None,
        "margin": margin / n if n else None,
    }


__all__ = ["agreed_group_count", "gather_reward_metrics", "padded_width", "plan_forward_groups", "split_by_length"]
