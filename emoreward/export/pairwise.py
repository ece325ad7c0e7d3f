"""Pairwise judges as group rewards for GRPO: each completion's reward is its win rate against the other completions
of its prompt's group (ties a half, both orders averaged), for any judge (a generative judge, trained or zero-shot,
or a scalar reward model through its verdicts). Groups come from the prompt's content and context, never from the
batch's order or its split across processes. See docs/serving.md#pairwise-group-rewards."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from emoreward.data.context import RewardContext, reward_context
from emoreward.data.pairs import PreferencePair
from emoreward.data.text import identity_text
from emoreward.data.verdicts import Verdict
from emoreward.export.grpo import completion_text, dataset_column, default_reward_name
from emoreward.export.length_monitor import LengthMonitor, defined, logged_key


# what GRPOTrainer passes to a reward function beside the dataset's columns (not part of a row's content)
TRAINER_KWARGS = frozenset({"completion_ids", "trainer_state", "log_extra", "log_metric", "environments"})
# a verdict, seen from the first description: its score in the win rate
WIN_SCORE = {Verdict.FIRST: 1.0, Verdict.TIE: 0.5, Verdict.SECOND: 0.0}


@dataclass(frozen=True)
class Completion:
    """One completion to reward: its group (the content key of its prompt and context), its text and context."""

    group: Hashable
    text: str
    context: RewardContext


@dataclass
class GroupCost:
    """What one call cost: `comparisons` (distinct description pairs of a group judged), `verdicts` (verdicts
    asked of the judge: both orders of each comparison this process judged), `judge_calls` (the judge's own work
    for them, `judge_work`: a reward-model judge's descriptions scored, its cache serving the rest; a generative
    judge's model calls made, its call cache serving the rest; a judge that counts neither: `verdicts`),
    `invalid_orders` (INVALID verdicts), `undecided` (pairs whose both orders were INVALID: scored 0.5),
    `identical` (pairs of one text: 0.5 with no call) and `singletons` (groups of one completion: reward 0.5)."""

    comparisons: int = 0
    verdicts: int = 0
    judge_calls: int = 0
    invalid_orders: int = 0
    undecided: int = 0
    identical: int = 0
    singletons: int = 0

    def add(self, other: GroupCost) -> None:
        for key, value in vars(other).items():
            setattr(self, key, getattr(self, key) + value)


def prompt_key(prompt: Any, context: RewardContext) -> str:
    """The content key of a prompt's group: the prompt (text or messages, every text in `identity_text` form) and
    the context (subtitle, media paths, sample id), hashed. Equal prompts of one sample are one group, wherever
    they stand in the batch."""

    def normal(value: Any) -> Any:
        if isinstance(value, str):
            return identity_text(value)
        if isinstance(value, dict):
            return {str(k): normal(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
        if isinstance(value, (list, tuple)):
            return [normal(v) for v in value]
        return value

    fields = [context.subtitle and identity_text(context.subtitle), context.video, context.audio, context.sample_id]
    blob = json.dumps([normal(prompt), fields], ensure_ascii=False, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def _content_order(texts: Sequence[str]) -> list[str]:
    """Distinct texts of a group in the order of their content hashes (so no input order decides a pairing)."""
    return sorted(set(texts), key=lambda t: (hashlib.sha256(t.encode()).hexdigest(), t))


def opponent_pairs(texts: Sequence[str], opponents: int | None) -> list[tuple[str, str]]:
    """The distinct-text pairs of one group to judge, as (a, b) with a before b in content order.

    Args:
        texts: the group's completion texts (`identity_text` form; repeats allowed).
        opponents: None: every pair. k >= 1: each distinct text meets the next ceil(k/2) texts after it in content
            order, cyclically, so each meets at least min(k, n-1) others (a circulant design; n distinct texts).

    Returns:
        `list[tuple[str, str]]`, without repeats."""
    order = _content_order(texts)
    n = len(order)
    if opponents is None or opponents >= n - 1:
        return [(order[i], order[j]) for i in range(n) for j in range(i + 1, n)]
    step = math.ceil(opponents / 2)
    pairs = {tuple(sorted((i, (i + s) % n))) for i in range(n) for s in range(1, step + 1)}
    return [(order[i], order[j]) for i, j in sorted(pairs)]


def judge_work(judge: Any) -> int | None:
    """The work a judge has done so far by its own count: a reward-model judge's descriptions scored
    (`RewardModelJudge.n_scored`), a generative judge's model calls made (``stats.made``, cache hits excluded);
    None for a judge that counts neither."""
    scored = getattr(judge, "n_scored", None)
    if isinstance(scored, int):
        return scored
    made = getattr(getattr(judge, "stats", None), "made", None)
    return made if isinstance(made, int) else None


def judge_identity(judge: Any) -> str:
    """The content identity of a judge object, for its reward's default name (`default_reward_name`): a reward-model
    judge's `model_identity`; a generative judge's backends (their weights identity), strategy, verdict mode and
    decoding; any other judge its class and name."""
    from emoreward.models.loading import model_identity

    model = getattr(judge, "model", None)
    if model is not None and callable(getattr(model, "score_info", None)):
        return model_identity(model)
    parts = [type(judge).__module__, type(judge).__qualname__, getattr(judge, "name", None)]
    for key in ("judge_name", "strategy", "verdict_mode", "sampling"):
        parts.append(repr(getattr(judge, key, None)))
    parts += [getattr(getattr(judge, key, None), "identity", None) for key in ("mllm", "llm")]
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:16]


def judged_cost(
    judge: Any, items: Sequence[tuple[str, str, RewardContext]], comparisons: int
) -> tuple[list[float | None], GroupCost]:
    """`judge_pairs` of ``items`` with what it cost (`GroupCost`: ``comparisons`` of the whole plan, the verdicts
    asked, the judge's own work for them, the INVALID orders)."""
    before = judge_work(judge)
    scores, invalid = judge_pairs(judge, items)
    after = judge_work(judge)
    verdicts = 2 * len(items)
    calls = verdicts if before is None or after is None else after - before
    return scores, GroupCost(comparisons=comparisons, verdicts=verdicts, judge_calls=calls, invalid_orders=invalid)


def judge_pairs(judge: Any, items: Sequence[tuple[str, str, RewardContext]]) -> tuple[list[float | None], int]:
    """Scores of description a against b, both orders averaged (None where both orders were INVALID), and the
    number of INVALID orders.

    Args:
        judge: anything with ``judge(pairs) -> list[Judgement]`` (`emoreward.evaluation.judge.Judge`).
        items: (a, b, context) per comparison.
    """
    pairs = []
    for a, b, context in items:
        sample = context.sample_id or "group"
        media = context.media_ref()
        pairs.append(PreferencePair(sample, a, b, media=media))
        pairs.append(PreferencePair(sample, b, a, media=media))
    judgements = judge.judge(pairs) if pairs else []
    if len(judgements) != len(pairs):
        raise RuntimeError(f"the judge returned {len(judgements)} verdicts for {len(pairs)} pairs")
    scores: list[float | None] = []
    invalid = 0
    for k in range(0, len(pairs), 2):
        normal, swapped = judgements[k].verdict, judgements[k + 1].verdict.swapped()
        valid = [WIN_SCORE[v] for v in (normal, swapped) if v in WIN_SCORE]
        invalid += 2 - len(valid)
        scores.append(sum(valid) / len(valid) if valid else None)
    return scores, invalid


@dataclass(frozen=True)
class GroupPlan:
    """The comparisons one batch needs: `groups` (group key -> completion indices), `texts` (each completion in
    `identity_text` form) and `todo` ((group, a, b) per distinct pair to judge, in a fixed content order)."""

    groups: dict[Hashable, list[int]]
    texts: list[str]
    todo: list[tuple[Hashable, str, str]]
    contexts: dict[Hashable, RewardContext]

    @classmethod
    def of(cls, completions: Sequence[Completion], opponents: int | None) -> GroupPlan:
        groups: dict[Hashable, list[int]] = {}
        for k, c in enumerate(completions):
            groups.setdefault(c.group, []).append(k)
        texts = [identity_text(c.text) for c in completions]
        todo = []
        for key in sorted(groups, key=str):
            todo += [(key, a, b) for a, b in opponent_pairs([texts[k] for k in groups[key]], opponents)]
        return cls(groups, texts, todo, {c.group: c.context for c in completions})

    def requests(self, todo: Sequence[tuple[Hashable, str, str]]) -> list[tuple[str, str, RewardContext]]:
        """(a, b, the group's context) of each comparison, as `judge_pairs` takes them."""
        return [(a, b, self.contexts[g]) for g, a, b in todo]

    def win_rates(self, judged: dict[tuple[Hashable, str, str], float | None], cost: GroupCost) -> list[float]:
        """Each completion's mean score against the completions of its group it met (`group_rewards`)."""
        rewards = [0.5] * len(self.texts)
        cost.undecided = sum(judged[k] is None for k in self.todo)
        for key, members in self.groups.items():
            if len(members) == 1:
                cost.singletons += 1
                continue
            cost.identical += sum(
                self.texts[i] == self.texts[j] for x, i in enumerate(members) for j in members[x + 1 :]
            )
            for i in members:
                met = []
                for j in members:
                    if j == i:
                        continue
                    a, b = self.texts[i], self.texts[j]
                    if a == b:
                        met.append(0.5)
                    elif (key, a, b) in judged:
                        met.append(0.5 if judged[(key, a, b)] is None else judged[(key, a, b)])
                    elif (key, b, a) in judged:
                        met.append(0.5 if judged[(key, b, a)] is None else 1.0 - judged[(key, b, a)])
                rewards[i] = sum(met) / len(met) if met else 0.5
        return rewards


def group_rewards(
    completions: Sequence[Completion], judge: Any, opponents: int | None = None
) -> tuple[list[float], GroupCost]:
    """Each completion's win rate within its group: the mean, over the other completions it meets, of 1 (its
    description preferred), 0.5 (a tie, two equal texts, or both orders INVALID) or 0; with every pair that is
    (sum over the group's other completions j of s(i, j)) / (n - 1). A group of one completion gets 0.5.

    Args:
        completions: the batch (in any order: groups are keys, pairs are in content order).
        judge: a pairwise judge (`emoreward.evaluation.judge.Judge`).
        opponents: None (every pair of the group) or the opponents per distinct text (`opponent_pairs`).

    Returns:
        (rewards in [0, 1], one per completion; the call's `GroupCost`).
    """
    plan = GroupPlan.of(completions, opponents)
    scores, cost = judged_cost(judge, plan.requests(plan.todo), len(plan.todo))
    return plan.win_rates(dict(zip(plan.todo, scores)), cost), cost


def _distributed() -> tuple[int, int]:
    """(rank, world) of the running torch.distributed group (the one `accelerate launch` / a trainer started);
    (0, 1) when none is running. Starts nothing."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _gather(value: Any, world: int) -> list[Any]:
    """Every process's `value`, in rank order (`torch.distributed.all_gather_object`)."""
    import torch.distributed as dist

    out: list[Any] = [None] * world
    dist.all_gather_object(out, value)
    return out


class PairwiseGroupReward:
    """A GRPO reward function (``(prompts, completions, **kwargs) -> list[float]``) from a pairwise judge: each
    completion's win rate within its prompt's group (`group_rewards`), in [0, 1].

    Under ``accelerate launch`` (TRL splits a group's completions over processes) every process sends its part of
    the batch to the others (`torch.distributed.all_gather_object`), judges a share of the distinct comparisons, and
    receives the others' verdicts: every completion gets the reward it would get in one process, and each
    comparison is judged once.

    Args:
        judge: a pairwise judge (`emoreward.evaluation.judge.Judge`): `emoreward.judges.load_judge(...)` of a
            zero-shot judge YAML, a trained judge or a reward-model directory.
        opponents (`int`, *optional*): the judge budget: opponents per distinct completion (`opponent_pairs`);
            None (default): every pair of the group.
        subtitle_column, video_column, audio_column, sample_column (`str`): dataset columns of the context, as
            `EmotionReward` reads them.
        name (`str`, *optional*): the name GRPOTrainer logs the reward under; this function's own figures are
            logged as ``<name>/...``. Default ``pairwise_emotion_reward_<8 hex>``, the judge's content identity
            (`judge_identity`, `emoreward.export.grpo.default_reward_name`): two judges never share a key.
        length_monitor (`LengthMonitor`, `bool` or `None`): as `EmotionReward`.

    Attributes:
        cost (`GroupCost`): every call's work, added up (this process's judge calls).
    """

    def __init__(
        self,
        judge: Any,
        opponents: int | None = None,
        subtitle_column: str = "subtitle",
        video_column: str = "video",
        audio_column: str = "audio",
        sample_column: str = "sample_id",
        name: str | None = None,
        length_monitor: LengthMonitor | bool | None = True,
    ):
        if not callable(getattr(judge, "judge", None)):
            raise TypeError(f"judge must have a judge(pairs) method (emoreward.evaluation.judge.Judge), got {judge!r}")
        if opponents is not None and (isinstance(opponents, bool) or not isinstance(opponents, int) or opponents < 1):
            raise ValueError(f"opponents must be None (every pair) or an integer >= 1, got {opponents!r}")
        self.judge = judge
        self.opponents = opponents
        self.columns = {
            "subtitle": subtitle_column,
            "video": video_column,
            "audio": audio_column,
            "sample_id": sample_column,
        }
        self.__name__ = (
            name if name is not None else default_reward_name("pairwise_emotion_reward", judge_identity(judge))
        )
        self.length_monitor = LengthMonitor() if length_monitor is True else (length_monitor or None)
        self.cost = GroupCost()
        self.last_figures: dict[str, float | None] = {}

    def completions(self, prompts: Sequence[Any], completions: Sequence[Any], kwargs: dict) -> list[Completion]:
        """The call's completions with their groups and contexts (columns first, else what the prompt names)."""
        n = len(completions)
        if prompts is None or len(prompts) != n:
            raise ValueError(
                f"pairwise group rewards need one prompt per completion, got {prompts and len(prompts)} "
                f"for {n} completions"
            )
        columns = {key: dataset_column(kwargs, column, n) for key, column in self.columns.items()}
        names = {**{k: v for k, v in self.columns.items()}, "prompt": "prompts"}
        # every dataset column TRL passes is part of the row a completion answers (a clip id under any name): the
        # group is the prompt with its whole row, never the prompt text alone
        row_columns = {}
        for name in sorted(set(kwargs) - TRAINER_KWARGS):
            values = kwargs[name]
            if isinstance(values, (list, tuple)) and len(values) == n:
                row_columns[name] = values
        out = []
        for k in range(n):
            context = reward_context(
                prompt=prompts[k],
                **{key: columns[key][k] for key in self.columns},
                source=self.__name__,
                row=k + 1,
                names=names,
            )
            row = {name: values[k] for name, values in row_columns.items()}
            key = prompt_key([prompts[k], row] if row else prompts[k], context)
            out.append(Completion(key, completion_text(completions[k]), context))
        return out

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
        """Rewards in [0, 1], one per completion of this process (GRPOTrainer's reward-function contract).

        Raises:
            ValueError: prompts and completions of different lengths, a column of another length, or a completion of
                an unknown shape; DataError: a column and the prompt name different contexts.
            RuntimeError: the judge returned a different number of verdicts than pairs asked.
        """
        local = self.completions(prompts, completions, kwargs)
        rank, world = _distributed()
        if world == 1:
            rewards, cost = group_rewards(local, self.judge, self.opponents)
        else:
            rewards, cost = self._distributed_call(local, rank, world)
        self.cost.add(cost)
        self._log(rewards, [c.text for c in local], cost, kwargs.get("log_metric"))
        return rewards

    def _distributed_call(self, local: list[Completion], rank: int, world: int) -> tuple[list[float], GroupCost]:
        parts = _gather(local, world)  # one list per process, in rank order
        everything = [c for part in parts for c in part]
        start = sum(len(part) for part in parts[:rank])
        plan = GroupPlan.of(everything, self.opponents)
        mine = plan.todo[rank::world]  # this process's share of the distinct comparisons
        scores, cost = judged_cost(self.judge, plan.requests(mine), len(plan.todo))
        judged = {}
        for part in _gather(list(zip(mine, scores)), world):
            judged.update(part)
        rewards = plan.win_rates(judged, cost)
        return rewards[start : start + len(local)], cost

    def _log(self, rewards: list[float], texts: list[str], cost: GroupCost, log_metric: Any) -> None:
        figures: dict[str, float | None] = {
            f"{self.__name__}/comparisons": float(cost.comparisons),
            f"{self.__name__}/verdicts": float(cost.verdicts),
            f"{self.__name__}/judge_calls": float(cost.judge_calls),
            f"{self.__name__}/invalid_orders": float(cost.invalid_orders),
            f"{self.__name__}/undecided": float(cost.undecided),
        }
        if self.length_monitor is not None:  # under this function's own name (`logged_key`), as `EmotionReward`'s
            length = self.length_monitor.update(rewards, texts)
            figures.update({logged_key(key, self.__name__): value for key, value in length.items()})
        self.last_figures = figures
        if callable(log_metric):
            for key, value in defined(figures).items():
                log_metric(key, value)


def verl_group_scores(
    judge: Any,
    data_sources: Sequence[Any],
    solution_strs: Sequence[str],
    ground_truths: Sequence[Any],
    extra_infos: Sequence[dict | None],
    opponents: int | None = None,
    subtitle_key: str = "subtitle",
    sample_key: str = "sample_id",
) -> list[dict[str, float]]:
    """verl's batch reward contract (``reward_model.reward_manager=batch``) with pairwise group rewards: a group is
    the responses of one dataset row (equal data source, ground truth and ``extra_info``), whatever their places
    in the batch. Returns ``{"score", "comparisons"}`` per response (every dict has both keys). verl's reward_kwargs
    hold no objects, so a reward file builds the judge once and calls this (docs/serving.md#pairwise-group-rewards).

    Raises:
        ValueError: lists of different lengths."""
    n = len(solution_strs)
    ground_truths = list(ground_truths) if len(ground_truths) else [None] * n
    extra_infos = list(extra_infos) if len(extra_infos) else [None] * n
    data_sources = list(data_sources) if len(data_sources) else [None] * n
    if not len(ground_truths) == len(extra_infos) == len(data_sources) == n:
        raise ValueError(
            f"{n} responses but {len(data_sources)} data sources, {len(ground_truths)} ground truths and "
            f"{len(extra_infos)} extra_infos"
        )
    completions = []
    for k in range(n):
        info = extra_infos[k] or {}
        context = reward_context(
            subtitle=info.get(subtitle_key), sample_id=info.get(sample_key), source="verl", row=k + 1
        )
        row = {"data_source": data_sources[k], "ground_truth": ground_truths[k], "extra_info": info}
        completions.append(Completion(prompt_key(row, context), solution_strs[k], context))
    rewards, cost = group_rewards(completions, judge, opponents)
    return [{"score": float(r), "comparisons": float(cost.comparisons)} for r in rewards]


__all__ = [
    "Completion",
    "GroupCost",
    "PairwiseGroupReward",
    "group_rewards",
    "judge_identity",
    "judge_work",
    "opponent_pairs",
    "prompt_key",
    "verl_group_scores",
]
