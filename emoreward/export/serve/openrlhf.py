"""OpenRLHF's remote reward requests: the description a policy wrote, recovered from OpenRLHF's decoded query
(`description_from_query`), and the pad / EOS / end-of-turn markers stripped from it (`query_markers`)."""

from __future__ import annotations

import functools
import re
from typing import Any


# End-of-turn, EOS and pad markers of common chat models, as `tokenizer.decode(..., skip_special_tokens=False)`
# writes them into OpenRLHF's queries (Qwen / ChatML, Llama 3, Phi, Gemma, Mistral / Llama 2, GPT-2 style).
DEFAULT_QUERY_MARKERS = (
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|end_of_text|>",
    "<|end|>",
    "<end_of_turn>",
    "<eos>",
    "<pad>",
    "</s>",
)


def _marker_pattern(markers: list[str], at: str) -> re.Pattern:
    return _compiled_marker_pattern(tuple(markers), at)


@functools.lru_cache(maxsize=64)
def _compiled_marker_pattern(markers: tuple[str, ...], at: str) -> re.Pattern:
    """The regex of a run of `markers` at the start or end of a query (compiled once per marker set: the markers
    are fixed for a server's life, and every OpenRLHF query is matched against them)."""
    alternatives = "|".join(re.escape(m) for m in sorted(set(markers), key=len, reverse=True) if m)
    if at == "start":
        return re.compile(rf"^(?:\s*(?:{alternatives}))+")
    return re.compile(rf"(?:{alternatives})(?:\s*(?:{alternatives}))*\s*$")


def description_from_query(
    query: str, prompt: str | None, pad_markers: list[str], end_markers: list[str]
) -> str | None:
    """The response text of an OpenRLHF query, exactly as the policy wrote it; None if ``query`` does not contain
    ``prompt`` where it should.

    OpenRLHF builds ``query`` as ``tokenizer.decode(prompt_ids + response_ids, skip_special_tokens=False)``: the
    response ends with the policy's EOS (its end-of-turn token for chat models), and older versions decode
    whole padded rows (pad / EOS tokens on the left of the prompt and after the EOS). So: strip ``pad_markers``
    (and whitespace between them) from the start of the query and of the prompt, remove the prompt, then strip
    ``end_markers`` (and whitespace between and after them) from the end. Whitespace the policy wrote before its
    end-of-turn token stays part of the description (it changes a chat model's tokens).
    """
    text = _marker_pattern(pad_markers, "start").sub("", query, count=1) if pad_markers else query
    if prompt is not None:
        prompt = _marker_pattern(pad_markers, "start").sub("", prompt, count=1) if pad_markers else prompt
        if text.startswith(prompt):
            text = text[len(prompt) :]
        elif text.lstrip().startswith(prompt.lstrip()):  # decoders that write a space after a special token
            text = text.lstrip()[len(prompt.lstrip()) :]
        else:
            return None
    return _marker_pattern(end_markers, "end").sub("", text, count=1) if end_markers else text


def query_markers(model: Any, extra: list[str] | tuple[str, ...] = ()) -> tuple[list[str], list[str]]:
    """(pad markers, end markers) for `description_from_query`: `DEFAULT_QUERY_MARKERS`, the reward model's own
    EOS and pad tokens (end markers also its SEP token, which closes an encoder's input), and ``extra`` (the
    policy's markers when they are not among these)."""
    tokenizer = getattr(model, "tokenizer", None)
    own = [getattr(tokenizer, name, None) for name in ("eos_token", "pad_token")] if tokenizer is not None else []
    own = [t for t in own if isinstance(t, str) and t]
    sep = getattr(tokenizer, "sep_token", None) if tokenizer is not None else None
    pad = [*DEFAULT_QUERY_MARKERS, *own, *extra]
    end = pad + ([sep] if isinstance(sep, str) and sep else [])
    return pad, end
