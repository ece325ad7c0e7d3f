"""Trained generative judges: a chat LM (SmolLM2, any causal LM; LoRA through peft) learns to answer S1's question
(`zero_shot.strategies.compare_prompt`, the template it is judged with) with the verdict, by TRL's `SFTTrainer` and
then, optionally, `DPOTrainer` (the right verdict preferred to a wrong one); every pair in both orders. A trained
judge is a folder (merged weights + `judge.yaml`, logit verdicts) that every command loads as a judge.
See docs/judges.md#trained-judges.
"""

from __future__ import annotations

import dataclasses
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from trl import DPOTrainer, SFTTrainer

from emoreward.data import PreferencePair
from emoreward.models.base import TRAINED_JUDGE_FILE, check_finite_weights
from emoreward.training.config import public_config, with_fields
from emoreward.training.distributed import distributed_setup, wait_for_everyone
from emoreward.training.judge_config import JudgeTrainConfig
from emoreward.training.preprocess import ExclusionReport
from emoreward.training.provenance import write_training_data
from emoreward.utils.io import atomic_write_json, atomic_write_text


logger = logging.getLogger(__name__)
JUDGE_FILE = TRAINED_JUDGE_FILE  # a trained judge's definition, in its folder (its one owner: `models.base`)
PROMPTS_FILE = "prompts.yaml"  # the prompt set it was trained with, beside it
WRONG = {"1": ("2",), "2": ("1",), "tie": ("1", "2")}  # DPO: the verdicts a label's right one is preferred to
# each training row's pair (its position in `training_orders` // 2), what `OrdersTogetherSampler` keeps together
PAIR_COLUMN = "pair_index"


def training_orders(
    pairs: list[PreferencePair], *, ties: str = "train"
) -> tuple[list[tuple[PreferencePair, str]], list[str]]:
    """What a judge trains on: each labelled pair in both orders (``(pair, "as given")``, ``(swapped, "swapped")``),
    so position carries no signal; gold ties left out with ``ties="drop"``.

    Returns:
        (the ordered pairs, the sample ids of the gold ties dropped).

    Raises:
        ValueError: an unlabelled pair (names its row)."""
    orders, dropped = [], []
    for pair in pairs:
        if pair.label is None:
            raise ValueError(f"row {pair.row}: pair {pair.sample_id!r} has no label; a judge trains on labelled pairs")
        if pair.label == "tie" and ties == "drop":
            dropped.append(pair.sample_id)
            continue
        orders += [(pair, "as given"), (pair.swapped(), "swapped")]
    return orders, dropped


def judge_exclusions(pairs: list[PreferencePair], *, ties: str = "train") -> ExclusionReport:
    """The pairs a judge leaves out of its training (`training_orders`: gold ties with ``ties="drop"``), counted as
    the reward recipes count theirs (reason ``tie_dropped``): what a fold's ``exclusions`` and log line report."""
    dropped = training_orders(pairs, ties=ties)[1]
    return ExclusionReport(
        n_input=len(pairs), n_kept=len(pairs) - len(dropped), excluded={"tie_dropped": dropped} if dropped else {}
    )


def verdict_examples(
    pairs: list[PreferencePair], prompts: Any, tokenizer: Any, *, ties: str = "train"
) -> tuple[list[dict[str, str]], int]:
    """SFT rows ``{"prompt", "completion"}``: each pair of `training_orders`, the prompt the chat text the judge
    reads up to its answer (`zero_shot.backends.transformers_text.chat_prompt_text` + the prompt set's answer
    prefix), the completion the verdict label as logit scoring reads it (`answer_separator` + label).

    Returns:
        (rows, number of gold ties dropped with ``ties="drop"``).

    Raises:
        ValueError: an unlabelled pair (names its row)."""
    orders, dropped = training_orders(pairs, ties=ties)
    rows: list[dict] = []
    for k, (ordered, _) in enumerate(orders):
        prompt, sep = judge_prompt(ordered, prompts, tokenizer)
        rows.append({"prompt": prompt, "completion": sep + ordered.label, PAIR_COLUMN: k // 2})  # the parser's label
    return rows, len(dropped)


def preference_examples(pairs: list[PreferencePair], prompts: Any, tokenizer: Any, *, ties: str = "train") -> list:
    """DPO rows ``{"prompt", "chosen", "rejected", "pair_index"}``: for each pair of `training_orders`, the right
    verdict against each wrong one."""
    rows = []
    for k, (ordered, _) in enumerate(training_orders(pairs, ties=ties)[0]):
        prompt, sep = judge_prompt(ordered, prompts, tokenizer)
        for wrong in WRONG[ordered.label]:
            rows.append(
                {"prompt": prompt, "chosen": sep + ordered.label, "rejected": sep + wrong, PAIR_COLUMN: k // 2}
            )
    return rows


def judge_prompt(pair: PreferencePair, prompts: Any, tokenizer: Any) -> tuple[str, str]:
    """(the chat text up to the verdict label, the separator before the label): the logit-verdict request of S1
    for a text judge, built by the functions the judge uses."""
    from zero_shot.backends.base import ChatRequest
    from zero_shot.backends.transformers_text import answer_separator, chat_prompt_text
    from zero_shot.strategies import compare_prompt

    request = ChatRequest(
        prompt=compare_prompt(prompts, pair), system=prompts.system, answer_prefix=prompts.logit_answer_prefix
    )
    return chat_prompt_text(tokenizer, request) + request.answer_prefix, answer_separator(request.answer_prefix)


def load_chat_model(config: JudgeTrainConfig):
    """(causal LM in float32, tokenizer) of the recipe's model (a GGUF file is dequantised by transformers); with a
    multimodal ``family``, (the family's model in float32, or bfloat16 with ``bf16`` on a GPU, its processor) as the
    zero-shot judge loads them (`zero_shot.backends.multimodal.load_processor`)."""
    import torch
    from transformers import AutoModelForCausalLM

    from emoreward.models.text import load_pretrained
    from zero_shot.backends.hf_common import resolve_model_path

    path = resolve_model_path(config.model_name_or_path)
    if config.family is not None:
        import transformers

        from zero_shot.backends.multimodal import check_family, load_processor

        spec = check_family(config.family, config.use_audio_in_video)
        processor = load_processor(path, config.family, trust_remote_code=config.trust_remote_code)
        on_gpu = torch.cuda.is_available() and not config.use_cpu  # frozen weights in bf16 on a GPU only
        model = getattr(transformers, spec.model_class).from_pretrained(
            path, dtype=torch.bfloat16 if config.bf16 and on_gpu else torch.float32,
            trust_remote_code=config.trust_remote_code,
        )  # fmt: skip
        return model, processor
    tokenizer = load_chat_tokenizer(config)
    model = load_pretrained(
        AutoModelForCausalLM, path, gguf_file=config.gguf_file, dtype=torch.float32,
        trust_remote_code=config.trust_remote_code,
    )  # fmt: skip
    return model, tokenizer


def load_chat_tokenizer(config: JudgeTrainConfig):
    """A text judge recipe's tokenizer (no weights read), as `load_chat_model` loads it: the pad token the EOS token
    where the tokenizer has none."""
    from transformers import AutoTokenizer

    from zero_shot.backends.hf_common import resolve_model_path

    extra = {"gguf_file": config.gguf_file} if config.gguf_file else {}
    path = resolve_model_path(config.model_name_or_path)
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=config.trust_remote_code, **extra)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def check_verdict_length(length: int, max_length: int | None, sample: str, order: str | None, hint: str) -> None:
    """The one length rule of a trained judge's sequences, text or multimodal: a training sequence (the scored text
    and its verdict) of `length` tokens must fit `max_length` whole, since TRL would cut its end, the verdict, the
    only trained token. `order`: "as given" / "swapped" where known; `hint`: what to change.

    Raises:
        ValueError: ``length > max_length``, naming the sample, the order, the length and max_length."""
    if max_length is not None and length > max_length:
        where = f"sample {sample!r}" + (f", order {order}" if order else "")
        raise ValueError(
            f"{where}: {length} tokens (prompt + verdict) > max_length {max_length}; the verdict would be cut, "
            f"so nothing is trained: {hint}"
        )


def check_text_verdict_lengths(
    pairs: list[PreferencePair], prompts: Any, tokenizer: Any, max_length: int | None, *, dpo: bool, ties: str
) -> None:
    """Every training sequence of a text judge (`verdict_examples`, and with `dpo` the wrong verdicts of
    `preference_examples`), tokenized as TRL trains it (prompt + verdict + the EOS TRL appends), checked by
    `check_verdict_length` before any training.

    Raises:
        ValueError: the first sequence longer than `max_length` (sample, order, length, max_length)."""
    if max_length is None:
        return
    eos = tokenizer.eos_token or ""
    for ordered, order in training_orders(pairs, ties=ties)[0]:
        prompt, sep = judge_prompt(ordered, prompts, tokenizer)
        labels = (ordered.label, *(WRONG[ordered.label] if dpo else ()))
        length = max(len(tokenizer(prompt + sep + label + eos)["input_ids"]) for label in labels)
        check_verdict_length(length, max_length, ordered.sample_id, order, "raise max_length or shorten the prompt")


def check_judge_lengths(config: JudgeTrainConfig, pairs: list[PreferencePair]) -> None:
    """A text judge recipe's training sequences against its ``max_length`` (`check_text_verdict_lengths`, the
    tokenizer only), before any model is loaded; a multimodal judge's are checked by the same rule
    (`check_verdict_length`) as `MediaVerdictCollator` builds them, with their media.

    Raises:
        ValueError: a sequence longer than max_length (names the sample, the order and both lengths)."""
    if config.family is not None:
        return
    from zero_shot.prompts import load_prompts

    check_text_verdict_lengths(
        pairs, load_prompts(config.prompts), load_chat_tokenizer(config), config.max_length,
        dpo=config.dpo_epochs > 0, ties=config.ties,
    )  # fmt: skip


def _peft_config(config: JudgeTrainConfig):
    from peft import LoraConfig

    return LoraConfig(
        r=config.lora_r,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora_dropout,
        target_modules=config.lora_target_modules or _default_targets(config),
        task_type="CAUSAL_LM",
    )


def _default_targets(config: JudgeTrainConfig) -> str:
    """Every linear layer of a text LM; of a multimodal family, the language model's (never an encoder's)."""
    if config.family is None:
        return "all-linear"
    from emoreward.models.backbones import get_backbone, lora_target_regex

    return lora_target_regex(get_backbone(config.family))


def media_backend(config: JudgeTrainConfig, model, processor):
    """The zero-shot `MultimodalBackend` over the model being trained: what a trained multimodal judge's training
    text is built by (its chat text, media reading and checks, `verdict_sequences`), so it is the scored text."""
    from zero_shot.backends.multimodal import MultimodalBackend

    return MultimodalBackend(
        config.family,
        model,
        processor,
        use_audio_in_video=config.use_audio_in_video,
        identity="training",
        fps=config.fps,
        max_frames=config.max_frames,
        min_pixels=config.min_pixels,
        max_pixels=config.max_pixels,
    )


def judge_request(pair: PreferencePair, prompts: Any, backend: Any, media_root: str | None):
    """S1's logit-verdict request for `pair` as the zero-shot judge builds it for `backend`: the pair's media
    (`zero_shot.strategies.resolve_media`), the question naming what the model gets (`media_kind`), the system
    prompt, the answer prefix and the verdict labels."""
    from zero_shot.backends.base import ChatRequest
    from zero_shot.strategies import VERDICT_LABELS, compare_prompt, media_kind, resolve_media

    media = resolve_media(pair, media_root)
    return ChatRequest(
        prompt=compare_prompt(prompts, pair, media_kind(backend, media)),
        system=prompts.system,
        media=media,
        score_labels=VERDICT_LABELS,
        answer_prefix=prompts.logit_answer_prefix,
    )


def media_verdict_examples(
    pairs: list[PreferencePair], prompts: Any, backend: Any, *, media_root: str | None = None, ties: str = "train"
) -> tuple[list[tuple], list[tuple], int]:
    """A multimodal judge's SFT and DPO examples: ``(request, label, pair_index)`` and ``(request, chosen, rejected,
    pair_index)`` for each labelled pair in both orders (`judge_request`; labels and pair indices as
    `verdict_examples` / `preference_examples` give them), and the number of gold ties dropped with ``ties="drop"``.

    Raises:
        ValueError: an unlabelled pair (names its row)."""
    orders, dropped = training_orders(pairs, ties=ties)
    sft, dpo = [], []
    for k, (ordered, _) in enumerate(orders):
        request = judge_request(ordered, prompts, backend, media_root)
        sft.append((request, ordered.label, k // 2))
        dpo += [(request, ordered.label, wrong, k // 2) for wrong in WRONG[ordered.label]]
    return sft, dpo, len(dropped)


def check_judge_media(config: JudgeTrainConfig, pairs: list[PreferencePair]) -> None:
    """Every pair's media as a multimodal judge recipe reads it (`zero_shot.media.plan_media` with the files
    checked), before any model is loaded; nothing for a text judge.

    Raises:
        MediaError: a sample lacks the media the family reads, or a file is missing or empty (names the sample and
            the file)."""
    config.media_files(pairs)


class MediaVerdictCollator:
    """Batches of a multimodal judge's examples for TRL, collated here because TRL's vision collators take images
    only (no video frames, no audio): each row is `backend.verdict_sequences` (the scored text, token for token)
    with its label appended (`with_continuation`), right-padded; media tensors concatenated in row order.

    ``mode="sft"``: `SFTTrainer` rows (``labels``: -100 but on the verdict tokens). ``mode="dpo"``: `DPOTrainer`
    rows, every chosen sequence then every rejected one (``completion_mask`` on the verdict tokens).

    Raises:
        ValueError: a sequence longer than ``max_length`` (`check_verdict_length`; media tokens are never cut)."""

    PAD_ZERO = ("attention_mask", "mm_token_type_ids", "token_type_ids", "completion_mask")

    def __init__(self, backend, examples: list[tuple], *, mode: str, max_length: int | None):
        self.backend, self.examples, self.mode, self.max_length = backend, examples, mode, max_length

    def _sequence(self, request, label: str) -> tuple[dict, int]:
        from zero_shot.backends.multimodal import with_continuation

        inputs, (cont,) = self.backend.verdict_sequences(request, (label,))
        n_prompt = int(inputs["input_ids"].shape[1])
        row = with_continuation(inputs, cont)
        check_verdict_length(
            int(row["input_ids"].shape[1]), self.max_length,
            request.media.sample_id if request.media is not None else "?", None,
            "media tokens are never cut: raise max_length or lower max_frames / max_pixels",
        )  # fmt: skip
        return row, n_prompt

    def __call__(self, rows: list[dict]) -> dict:
        import torch

        examples = [self.examples[int(r["index"])] for r in rows]
        seqs = [self._sequence(e[0], e[1]) for e in examples]  # the target (SFT) or the chosen verdict (DPO)
        if self.mode != "sft":
            seqs += [self._sequence(e[0], e[2]) for e in examples]  # then every rejected one
        width = max(int(row["input_ids"].shape[1]) for row, _ in seqs)
        pad_id = self.backend.tokenizer.pad_token_id
        out: dict = {}
        for key in dict.fromkeys(k for row, _ in seqs for k in row):  # a row without media lacks its keys
            values = [row[key] for row, _ in seqs if key in row]
            if key == "use_audio_in_video":
                out[key] = any(values)
            elif key in ("input_ids", *self.PAD_ZERO):
                fill = pad_id if key == "input_ids" else 0
                out[key] = torch.stack([
                    torch.nn.functional.pad(row[key][0], (0, width - row[key].shape[1]), value=fill)
                    if key in row else torch.zeros(width, dtype=torch.long)
                    for row, _ in seqs
                ])  # fmt: skip
            else:  # media tensors (frames' patches, grids, audio features): one entry per clip, in row order
                out[key] = torch.cat([v if v.dim() else v.reshape(1) for v in values])
        positions = torch.arange(width)
        target = torch.stack([(positions >= n) & (positions < row["input_ids"].shape[1]) for row, n in seqs])
        if self.mode == "sft":
            out["labels"] = out["input_ids"].masked_fill(~target, -100)
        else:
            out["completion_mask"] = target.long()
        return out


def fit_judge(
    config: JudgeTrainConfig, pairs: list[PreferencePair], output_dir: str | Path, *, keep_model: bool = False
) -> dict:
    """Train one judge on `pairs` (SFT, then DPO when ``dpo_epochs > 0``) and save it to `output_dir` (merged
    weights, tokenizer or processor, `training_data.json`: the in-sample check of evaluate / judge / rank,
    `judge.yaml`).

    Returns:
        ``{"sft_rows", "dpo_rows", "exclusions", "train_seconds", "train_log"}`` (`exclusions`:
        `judge_exclusions`, the gold ties dropped); with `keep_model`, also
        ``"model"`` and ``"processing_class"`` (the merged model in memory, for checks against the saved folder).

    Raises:
        ValueError: no pair to train on (all dropped), an unlabelled pair, or a text judge's sequence longer than
            ``max_length`` (`check_text_verdict_lengths`, before any training)."""
    from transformers import set_seed

    from zero_shot.prompts import load_prompts

    set_seed(config.seed)
    out = Path(output_dir)
    prompts = load_prompts(config.prompts)
    check_judge_media(config, pairs)
    model, tokenizer = load_chat_model(config)
    collators: dict[str, Any] = {}
    media = {}
    if config.family is not None:  # rows index examples the collator turns into the scored sequences
        backend = media_backend(config, model, tokenizer)
        sft, dpo, dropped = media_verdict_examples(
            pairs, prompts, backend, media_root=config.media_root, ties=config.ties
        )
        rows = [{"index": i, PAIR_COLUMN: e[-1]} for i, e in enumerate(sft)]
        dpo_rows = [{"index": i, "images": [], PAIR_COLUMN: e[-1]} for i, e in enumerate(dpo)]
        dpo_rows = dpo_rows if config.dpo_epochs > 0 else []
        collators = {
            "sft": MediaVerdictCollator(backend, sft, mode="sft", max_length=config.max_length),
            "dpo": MediaVerdictCollator(backend, dpo, mode="dpo", max_length=config.max_length),
        }
        media = {"dataset_kwargs": {"skip_prepare_dataset": True}, "remove_unused_columns": False}
    else:
        check_text_verdict_lengths(
            pairs, prompts, tokenizer, config.max_length, dpo=config.dpo_epochs > 0, ties=config.ties
        )  # before any training
        rows, dropped = verdict_examples(pairs, prompts, tokenizer, ties=config.ties)
        dpo_rows = preference_examples(pairs, prompts, tokenizer, ties=config.ties) if config.dpo_epochs > 0 else []
    if not rows:
        raise ValueError(f"no pair to train the judge on ({dropped} gold ties dropped with ties: drop)")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="emoreward-judge-") as scratch:  # the trainers save nothing themselves
        args = sft_arguments(config, output_dir=str(Path(scratch) / "sft"), save_strategy="no", **media)
        model, log = _stage(JudgeSFTTrainer, model, args, rows, tokenizer, config, collators.get("sft"))
        if dpo_rows:
            dpo_args = dpo_arguments(
                config,
                output_dir=str(Path(scratch) / "dpo"),
                save_strategy="no",
                **({"remove_unused_columns": False} if media else {}),
            )
            model, dpo_log = _stage(
                JudgeDPOTrainer, model, dpo_args, dpo_rows, tokenizer, config, collators.get("dpo")
            )
            log += [{**entry, "stage": "dpo"} for entry in dpo_log]
    seconds = time.perf_counter() - start
    check_finite_weights(model, f"{config.run_name or 'judge'}: the trained judge")  # never saved when broken
    if config.process_index == 0:  # under `accelerate launch` every process holds the same weights: one writes
        write_training_data(out, config.train_file, pairs)  # before judge.yaml: a whole judge always has its record
        save_judge(model, tokenizer, config, out)
    wait_for_everyone(config)  # the folder is whole before any process reads it
    result = {
        "sft_rows": len(rows),
        "dpo_rows": len(dpo_rows),
        "exclusions": judge_exclusions(pairs, ties=config.ties).to_dict(),  # as a reward model's report counts them
        "train_seconds": seconds,
        "train_log": log,
    }
    return {**result, "model": model, "processing_class": tokenizer} if keep_model else result


def sft_arguments(config: JudgeTrainConfig, **stage: Any) -> JudgeTrainConfig:
    """The SFT stage's arguments: the recipe itself (a `trl.SFTConfig`, so every field reaches `SFTTrainer`) with
    `stage` set (where the stage writes, a multimodal judge's dataset settings)."""
    return with_fields(config, **stage)


def dpo_arguments(config: JudgeTrainConfig, **stage: Any):
    """The DPO stage's `trl.DPOConfig`, from the one declared mapping (`emoreward.training.applicability`): every
    `TrainingArguments` field as the recipe has it, the SFTConfig fields DPO reads by the same name
    (`DPO_SHARED_FIELDS`), the DPO stage's own fields under DPOConfig's names (`DPO_FIELDS`: ``dpo_epochs`` ->
    ``num_train_epochs``, ``dpo_learning_rate`` -> ``learning_rate``, ``dpo_beta`` -> ``beta``), then `stage`.
    DPOConfig's own settings beyond these (its loss, reference model) are TRL's defaults.

    Raises:
        ValueError: a value DPOConfig refuses (TRL's message)."""
    from transformers import TrainingArguments
    from trl import DPOConfig

    from emoreward.training.applicability import DPO_FIELDS, DPO_SHARED_FIELDS

    names = [f.name for f in dataclasses.fields(TrainingArguments) if f.init] + list(DPO_SHARED_FIELDS)
    values = {name: getattr(config, name) for name in names}
    values.update({dpo: getattr(config, own) for own, dpo in DPO_FIELDS.items()})
    return DPOConfig(**{**values, **stage})


class OrdersTogetherSampler:
    """A shuffle of a judge's training rows that keeps each pair's rows next to each other: the pairs (``groups``:
    each row's pair, `PAIR_COLUMN`) in an order drawn from a generator seeded with ``seed + epoch`` (`set_epoch` is
    called before every epoch), each pair's rows in their own order (as given, then swapped). An optimizer step takes
    a contiguous run of rows (batches are dealt to processes in turn), so with an even batch size x accumulation (the
    recipe refuses an odd one) every SFT step holds both orders of each of its pairs, and with an even batch size
    every batch does: the "1" and "2" targets balance and no step rewards one answer position over the other. In
    DPO a gold tie's four rows may straddle two batches, each half balanced on its own. TRL's random sampler puts
    the two orders in different batches (a batch of 16 holds about 8 +- 2 "2" answers, and Adam follows that tilt).
    The order of an epoch depends on the seed, the epoch and the rows' pairs alone.

    Args:
        groups: each row's pair index, length ``len(dataset)``.
        seed: `data_seed`, else `seed`."""

    def __init__(self, groups: list[int], *, seed: int):
        by_pair: dict[int, list[int]] = {}
        for row, pair in enumerate(groups):
            by_pair.setdefault(int(pair), []).append(row)
        self.pairs, self.n_rows, self.seed, self.epoch = list(by_pair.values()), len(groups), int(seed), 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return self.n_rows

    def __iter__(self):
        import torch

        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        for k in torch.randperm(len(self.pairs), generator=generator).tolist():
            yield from self.pairs[k]


class OrdersTogether:
    """Mixin of the judge's SFT and DPO trainers: with ``orders_together`` the training rows are drawn by
    `OrdersTogetherSampler` from their `PAIR_COLUMN` (read from the prepared dataset, so TRL's own filtering or
    shuffling keeps each row's pair); without it, TRL's sampler (``train_sampling_strategy``)."""

    def __init__(self, *args, orders_together: bool = True, **kwargs):
        self.orders_together = orders_together
        super().__init__(*args, **kwargs)

    def _get_train_sampler(self, train_dataset=None):
        if not self.orders_together:
            return super()._get_train_sampler(train_dataset)
        dataset = self.train_dataset  # before the Trainer drops the columns the model does not take
        if PAIR_COLUMN not in dataset.column_names:
            raise ValueError(f"orders_together: the training rows have no {PAIR_COLUMN!r} column")
        seed = self.args.data_seed if self.args.data_seed is not None else self.args.seed
        return OrdersTogetherSampler(dataset[PAIR_COLUMN], seed=seed)


class JudgeSFTTrainer(OrdersTogether, SFTTrainer):
    """TRL's `SFTTrainer` drawing a pair's two orders together (`OrdersTogether`)."""


class JudgeDPOTrainer(OrdersTogether, DPOTrainer):
    """TRL's `DPOTrainer` drawing a pair's rows together (`OrdersTogether`)."""


def _stage(
    trainer_class, model, args, rows: list[dict], tokenizer, config: JudgeTrainConfig, collator=None
) -> tuple[Any, list]:
    """One TRL stage (`JudgeSFTTrainer` or `JudgeDPOTrainer`: a pair's orders drawn together with
    ``orders_together``) on ``rows`` with a fresh LoRA (merged into the weights after, so the next stage, or the
    saved judge, is a plain causal LM): (the model, the stage's log history). `collator`: a multimodal judge's
    (`MediaVerdictCollator`), None for TRL's own. A NaN loss or gradient norm stops the stage
    (`DivergenceGuard`, naming the run, the stage and its learning-rate field); the callbacks are the reward
    trainer's (`set_up_callbacks`: no dict printed per logging step)."""
    from datasets import Dataset

    from emoreward.training.trainer import set_up_callbacks

    dpo = issubclass(trainer_class, DPOTrainer)
    stage, rate_field = ("DPO", "dpo_learning_rate") if dpo else ("SFT", "learning_rate")
    trainer = trainer_class(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        peft_config=_peft_config(config) if config.use_peft else None,
        orders_together=config.orders_together,
        **({"data_collator": collator} if collator is not None else {}),
    )
    set_up_callbacks(trainer, f"{config.run_name or 'judge'} ({stage})", rate_field)  # a diverged stage: nothing saved
    trainer.train()
    model = trainer.model.merge_and_unload() if config.use_peft else trainer.model
    return model, list(trainer.state.log_history)


def save_judge(model, tokenizer, config: JudgeTrainConfig, out: Path) -> None:
    """Merged weights (safetensors), tokenizer and the prompt set (`prompts.yaml`) in `out`, then `judge.yaml`
    (written last: a folder with it is a whole judge): logit verdicts, greedy decoding, the model ``.``; the folder
    moves whole."""
    import shutil

    from zero_shot.prompts import load_prompts

    out.mkdir(parents=True, exist_ok=True)
    model.eval()
    model.save_pretrained(out, safe_serialization=True)
    if config.family is None:
        tokenizer.save_pretrained(out)
    else:  # the processor: tokenizer, image processor / feature extractor, chat template
        from zero_shot.backends.multimodal import save_processor

        save_processor(tokenizer, out)
    shutil.copyfile(load_prompts(config.prompts).source, out / PROMPTS_FILE)  # the questions it learned, kept
    definition = {
        "name": config.run_name or out.name,
        "description": f"trained judge ({config.model_name_or_path}, LoRA via TRL SFT"
        + (" + DPO" if config.dpo_epochs > 0 else "")
        + ")",
        "prompts": f"./{PROMPTS_FILE}",
        "verdict": "logits",
        "sampling": {"do_sample": False, "max_new_tokens": 8, "seed": 0},
        "mllm": _mllm_section(config, str(model.dtype).removeprefix("torch.")),
    }
    tmp = out / (JUDGE_FILE + ".tmp")
    tmp.write_text(yaml.safe_dump(definition, sort_keys=False), encoding="utf-8")
    tmp.replace(out / JUDGE_FILE)


def _mllm_section(config: JudgeTrainConfig, dtype: str) -> dict:
    """`judge.yaml`'s model section: the text backend, or the multimodal backend with the media settings the judge
    was trained with (its weights in the dtype they were trained in)."""
    if config.family is None:
        return {"backend": "transformers-text", "model": ".", "dtype": "float32", "device": "auto", "batch_size": 8}
    section = {
        "backend": "transformers-mllm",
        "family": config.family,
        "model": ".",
        "use_audio_in_video": config.use_audio_in_video,
        "dtype": dtype,
        "device": "auto",
        "batch_size": 1,
        "fps": config.fps,
        "max_frames": config.max_frames,
    }
    if config.min_pixels is not None:
        section.update(min_pixels=config.min_pixels, max_pixels=config.max_pixels)
    return section


def evaluate_trained_judge(
    folder: str | Path,
    pairs: list[PreferencePair],
    *,
    tie_policy: str = "wrong",
    controlled: tuple | None = None,
    media_root: str | None = None,
) -> dict:
    """Every metric of the shared harness for the judge saved in `folder` on `pairs` (both orders, one run, INVALID
    counted), as `emoreward evaluate` computes it (`media_root`: where a multimodal judge reads the pairs' media);
    with `controlled` (``(negatives, where they come from)``) the controlled-error section too
    (`emoreward.evaluation.harness.controlled_errors`: each negative against its original in both orders, swap
    consistency included)."""
    from emoreward.evaluation.harness import controlled_errors, evaluate_judgements, run_judge
    from zero_shot import load_judge

    judge = load_judge(Path(folder) / JUDGE_FILE, media_root=media_root)
    result = run_judge(judge, pairs, swap=True, runs=1)
    evaluation = evaluate_judgements(result, tie_policy=tie_policy)
    if controlled is not None:
        evaluation["controlled_errors"] = controlled_errors(judge, controlled[0], source=controlled[1])
    return evaluation


def run_judge_training(config: JudgeTrainConfig, *, log=print) -> dict:
    """The judge recipe's job, on the reward-model pipeline's machinery (`emoreward.training.pipeline`): the pairs in
    content order, the run identity checked and recorded (`run_identity.check_resumable`: another run's work is
    refused, the same run's finished folds and final fit are reused), cross-validation over folds grouped by sample
    (`CrossValidation`: each fold's judge trained on the others, judged by the shared harness on its own pairs with
    the controlled-error section of their negatives, one W&B run per fold), then the final judge on every pair
    (`<output_dir>/model`, `finished.json` last) and `report.json` / `report.md`. Every process of an `accelerate
    launch` runs it; the main one writes.

    Returns:
        the report (also `<output_dir>/report.json`): `cross_validation` (`{"k", "seed", "summary", "folds",
        "controlled_errors", ...}`), `folds_trained` / `folds_reused` (work done by this call), `final`,
        `model_dir`, `markdown`.

    Raises:
        ValueError / DataError: bad data (file, row, field); RunIdentityError: the folder holds another run's work."""
    import torch

    from emoreward.data import read_pairs
    from emoreward.data.negatives import generate_negatives
    from emoreward.data.pairs import BUNDLED, bundled_dataset_path, canonical_pairs
    from emoreward.training.pipeline import (
        CONTROLLED_SOURCE,
        FINISHED_FILE,
        CrossValidation,
        FitResult,
        final_fingerprint,
        load_finished,
        wandb_group,
        wandb_line,
    )
    from emoreward.training.run_identity import check_resumable, run_identity
    from emoreward.training.tracking import configure_wandb, finish_wandb, start_wandb_run, wandb_enabled

    source = bundled_dataset_path(config.train_file) if config.train_file in BUNDLED else config.train_file
    loaded = read_pairs(source)
    pairs = canonical_pairs(loaded.pairs)  # the file's row order (and name) changes nothing
    check_judge_media(config, pairs)  # every fold's media, before any model is loaded
    check_judge_lengths(config, pairs)  # every fold's sequences against max_length, before any training
    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    is_main = config.process_index == 0
    if not is_main:
        log = _silent
    check_resumable(config, run_identity(config, pairs), is_main=is_main)  # the scalar pipeline's rule and message
    wait_for_everyone(config)
    wandb_mode = configure_wandb(config)
    log(f"emoreward train: judge {config.model_name_or_path}, data {config.train_file}, output {out}")
    log(f"loaded {loaded.summary()}")
    if wandb_mode is not None:
        log(wandb_line(config, pairs, wandb_mode))
    report: dict = {
        "recipe": "judge",
        "config": public_config(config),
        "train_file": str(config.train_file),
        "n_pairs": len(pairs),
        "n_samples": loaded.n_samples,  # the counts and the annotators' agreement the reward report gives
        "n_records": loaded.n_records,
        "annotators": loaded.agreement.to_dict(),
        "wandb_mode": wandb_mode,
        "distributed": distributed_setup(config),
    }

    def fit(train: list[PreferencePair], fold_dir: Path, name: str) -> FitResult:
        record = fit_judge(config, train, fold_dir / "judge")
        return FitResult(
            fold_dir / "judge", judge_exclusions(train, ties=config.ties), record["train_seconds"],
            record["train_log"], 0.0, torch.get_num_threads(),
        )  # fmt: skip

    def evaluate(folder: Path, test: list[PreferencePair]) -> dict:
        negatives = generate_negatives(test).negatives  # of the held-out pairs only
        return evaluate_trained_judge(
            folder, test, controlled=(negatives, CONTROLLED_SOURCE), media_root=config.media_root
        )

    if config.cv_folds:
        with CrossValidation(config, pairs, fit=fit, evaluate=evaluate, log=log) as folds:
            report["folds_trained"] = len(folds.jobs)
            report["folds_reused"] = config.cv_folds - len(folds.jobs)
            report["cross_validation"], report["markdown"] = folds.result()
    if config.final_fit:
        model_dir, fingerprint = out / "model", final_fingerprint(config, pairs)
        report["final"] = load_finished(model_dir, fingerprint)
        if report["final"] is not None:
            log(f"final model: finished earlier, reusing {model_dir}")
        else:
            if wandb_enabled(config):
                start_wandb_run(
                    config, name=config.run_name or "emoreward-judge", job_type="final",
                    group=wandb_group(config, pairs), kind="final-fit",
                )  # fmt: skip
            report["final"] = fit_judge(config, pairs, model_dir)
            if is_main:  # written last: the folder is a whole judge of this run
                atomic_write_json(
                    model_dir / FINISHED_FILE, {"fingerprint": fingerprint, "evaluation": report["final"]}
                )
            seconds = report["final"]["train_seconds"]
            log(f"final judge (all {len(pairs)} pairs) saved to {model_dir}, trained {seconds:.0f}s")
        report["model_dir"] = str(model_dir)
    if is_main:
        atomic_write_json(out / "report.json", report)
        if report.get("markdown"):
            atomic_write_text(out / "report.md", report["markdown"] + "\n")
    finish_wandb()
    wait_for_everyone(config)
    return report


def _silent(*_args, **_kwargs) -> None:
    return None


__all__ = [
    "JUDGE_FILE",
    "JudgeTrainConfig",
    "JudgeDPOTrainer",
    "JudgeSFTTrainer",
    "MediaVerdictCollator",
    "OrdersTogetherSampler",
    "check_judge_lengths",
    "check_judge_media",
    "check_text_verdict_lengths",
    "check_verdict_length",
    "dpo_arguments",
    "evaluate_trained_judge",
    "fit_judge",
    "judge_exclusions",
    "judge_request",
    "load_chat_tokenizer",
    "media_verdict_examples",
    "preference_examples",
    "run_judge_training",
    "save_judge",
    "sft_arguments",
    "training_orders",
    "verdict_examples",
]
