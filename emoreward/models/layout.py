"""The token layout of a text reward model's (description, context) sequence: `text_input_ids` and
`text_input_ids_batch` are the one rule every route (training, scoring, serving, GRPO, export) calls.

- `"pair"` (encoders): `[CLS] context [SEP] description [SEP]`, right padding.
- `"chat"` (decoders): the chat template on `[user: context, assistant: description]`, tokenized as one text and
  ending at the assistant turn's end-of-turn token, which the value head reads.

Only the description is cut to fit `max_length`. See docs/training.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from emoreward.data.context import reward_context
from emoreward.data.text import normal_text
from emoreward.models.base import TextSettings
from emoreward.models.coverage import unknown_share_of_ids


_SENTINEL = "\u2063EMOREWARD_DESCRIPTION\u2063"


def context_text(instruction: str, subtitle: str | None) -> str:
    """The text a description is conditioned on: the instruction, plus `Subtitle: ...` when the sample has one, in
    the normal form of text (`emoreward.data.text.normal_text`)."""
    parts = [normal_text(instruction)] if instruction else []
    subtitle = reward_context(subtitle=subtitle).subtitle
    if subtitle:
        parts.append(f"Subtitle: {normal_text(subtitle)}")
    return "\n".join(parts)


@dataclass
class Encoded:
    """One tokenized (context, description) sequence: `input_ids`, `truncated` (the description did not fit
    `max_length`) and `unknown_share` (share of the description's own tokens that are the unknown token, `"pair"`
    layout only; None for `"chat"`)."""

    input_ids: list[int]
    truncated: bool
    unknown_share: float | None = None


@dataclass(frozen=True)
class _ChatFrame:
    head: str  # rendered text before the description
    tail: str  # rendered text after it, up to the end-of-turn token (trailing whitespace dropped)
    verbatim: bool  # the template inserts the description unchanged (head + description + tail is the rendering)


_FRAMES: dict[tuple[int, str], _ChatFrame] = {}


def _chat_frame(tokenizer: PreTrainedTokenizerBase, context: str) -> _ChatFrame:
    key = (id(tokenizer), context)
    if key not in _FRAMES:
        head, tail = _render(tokenizer, context, _SENTINEL).split(_SENTINEL)
        probe = "  probe\t text \n"
        verbatim = _render(tokenizer, context, probe) == head + probe + tail
        _FRAMES[key] = _ChatFrame(head, tail.rstrip(), verbatim)
    return _FRAMES[key]


def _render(tokenizer: PreTrainedTokenizerBase, context: str, description: str) -> str:
    messages = [{"role": "assistant", "content": description}]
    if context:
        messages.insert(0, {"role": "user", "content": context})
    return tokenizer.apply_chat_template(messages, tokenize=False)


def text_input_ids(
    tokenizer: PreTrainedTokenizerBase,
    settings: TextSettings,
    description: str,
    subtitle: str | None = None,
    *,
    truncate: bool = True,
) -> Encoded:
    """Token ids of one (context, description) sequence (layout: the module docstring); only the description is cut.

    Args:
        tokenizer: the model's tokenizer (a fast tokenizer for `"chat"`: token offsets are needed).
        settings: input format, instruction, length limit.
        description: the emotion description.
        subtitle: the sample's subtitle (context), or None.
        truncate: cut the description to fit; otherwise the full sequence is returned and only flagged.

    Raises:
        ValueError: the context and closing tokens alone leave no room for the description."""
    return text_input_ids_batch(tokenizer, settings, [description], [subtitle], truncate=truncate)[0]


def text_input_ids_batch(
    tokenizer: PreTrainedTokenizerBase,
    settings: TextSettings,
    descriptions: Sequence[str],
    subtitles: Sequence[str | None],
    *,
    truncate: bool = True,
) -> list[Encoded]:
    """`text_input_ids` of `N` sequences (the same ids), with one tokenizer call for all descriptions and one per
    distinct context; `subtitles` has one entry (or None) per description.

    Raises:
        ValueError: `len(subtitles) != len(descriptions)`, or a context that leaves no room for the description."""
    descriptions = [normal_text(d) for d in descriptions]  # one text, one reward, whatever its Unicode form
    if len(subtitles) != len(descriptions):
        raise ValueError(f"{len(descriptions)} descriptions but {len(subtitles)} subtitles")
    if not descriptions:
        return []
    contexts = [context_text(settings.instruction, s) for s in subtitles]
    if settings.input_format == "chat":
        return _chat_ids(tokenizer, settings.max_length, contexts, descriptions, truncate)
    cls_ids = [tokenizer.cls_token_id] if tokenizer.cls_token_id is not None else []
    sep_ids = [tokenizer.sep_token_id] if tokenizer.sep_token_id is not None else []
    distinct = [c for c in dict.fromkeys(contexts) if c]
    # verbose=False: the cut is ours (below); the tokenizer's model_max_length is the model's own (save_tokenizer)
    tokens = tokenizer(distinct, add_special_tokens=False, verbose=False)["input_ids"] if distinct else []
    prefixes = {"": cls_ids, **{c: cls_ids + ids + sep_ids for c, ids in zip(distinct, tokens)}}
    bodies = tokenizer(descriptions, add_special_tokens=False, verbose=False)["input_ids"]
    unknown = tokenizer.unk_token_id
    out = []
    for context, body in zip(contexts, bodies):
        prefix = prefixes[context]
        # the closing [SEP] stays even after an empty description, as batched `tokenizer([context], [""])` gives (a
        # single call `tokenizer(context, "")` drops the empty segment; RL stacks tokenize in batches)
        room = settings.max_length - len(prefix) - len(sep_ids)
        _check_room(room, settings.max_length, len(prefix) + len(sep_ids))
        share = unknown_share_of_ids(body, unknown)
        truncated = len(body) > room
        if truncated and truncate:
            body = body[:room]
        out.append(Encoded(prefix + body + sep_ids, truncated, share))
    return out


def _chat_ids(tokenizer, max_length: int, contexts: list[str], descriptions: list[str], truncate: bool) -> list:
    spans = []  # (text, start, end): the sequence's text and where the description lies in it
    for context, description in zip(contexts, descriptions):
        frame = _chat_frame(tokenizer, context)
        if frame.verbatim:
            head = len(frame.head)
            spans.append((frame.head + description + frame.tail, head, head + len(description)))
        else:  # e.g. a template that trims the content: take its own rendering
            rendered = _render(tokenizer, context, description)
            full_tail = rendered[len(frame.head) :]
            end = len(frame.head) + len(full_tail.rstrip()) - len(frame.tail)
            spans.append((rendered[:end] + frame.tail, len(frame.head), end))
    texts = [text for text, _, _ in spans]
    enc = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True, verbose=False)  # cut below
    out = []
    for (_, start, end), ids, offsets in zip(spans, enc["input_ids"], enc["offset_mapping"]):
        ids = list(ids)
        if len(ids) <= max_length:
            out.append(Encoded(ids, False))
            continue
        # description tokens: those that start inside the description; the tail starts at the first token at or
        # after its end (a token that straddles the head/description border stays with the head)
        first = next((k for k, (s, _) in enumerate(offsets) if s >= start), len(ids))
        tail_at = _tail_start(offsets, end)
        removable = tail_at - first
        excess = len(ids) - max_length
        _check_room(removable - excess, max_length, len(ids) - removable)
        out.append(Encoded(ids if not truncate else ids[: tail_at - excess] + ids[tail_at:], True))
    return out


def _tail_start(offsets: Sequence[tuple[int, int]], end: int) -> int:
    """Index of the first token of a chat sequence's tail (the tokens a cut keeps after the description): the first
    token of nonzero width at or after character `end`, where the description ends."""
    return next((k for k, (s, e) in enumerate(offsets) if s >= end and e > s), len(offsets))


def kept_end_tokens(tokenizer: PreTrainedTokenizerBase, settings: TextSettings, subtitle: str | None = None) -> int:
    """How many tokens at the end of a `"chat"` sequence the cut keeps (the description's closing tokens: the
    end-of-turn token the value head reads, and any token the template writes between it and the description).

    This is the cut of `text_input_ids` as a plain reader writes it: a sequence of `N > max_length` tokens (the
    rendered template, whitespace after the end-of-turn token dropped, tokenized whole) is read as
    `ids[:max_length - n] + ids[-n:]` with `n` this number (the export's card prints it; `export_hf` checks the
    recipe on descriptions longer than `max_length`).

    Returns:
        `int` >= 0: tokens after the description in the sequence of `subtitle`'s context.

    Raises:
        ValueError: `settings.input_format` is not `"chat"` (the `"pair"` layout keeps its `[SEP]`, as the
            tokenizer's own `truncation` does)."""
    if settings.input_format != "chat":
        raise ValueError(f"kept_end_tokens applies to the 'chat' layout, not {settings.input_format!r}")
    context = context_text(settings.instruction, subtitle)
    frame = _chat_frame(tokenizer, context)
    probe = "Calm."
    text = frame.head + probe + frame.tail if frame.verbatim else _render(tokenizer, context, probe).rstrip()
    end = text.rfind(probe) + len(probe)
    offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)["offset_mapping"]
    return len(offsets) - _tail_start(offsets, end)


def _check_room(room: int, max_length: int, fixed: int) -> None:
    if room <= 0:
        raise ValueError(
            f"max_length={max_length} leaves no room for the description (the context and special tokens take "
            f"{fixed} tokens)"
        )


__all__ = ["Encoded", "context_text", "kept_end_tokens", "text_input_ids", "text_input_ids_batch"]
