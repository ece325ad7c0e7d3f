"""The zero-shot judge: strategies S1-S4 (EmoPrefer, section 4.1 and appendix D) behind the `Judge` protocol.

| strategy | step 1 (`describe`, shared)       | step 2                                   | step 3                      |
|----------|-----------------------------------|------------------------------------------|-----------------------------|
| S1       | MLLM: media + d1, d2 -> verdict (`compare`) |                                 |                             |
| S2       | MLLM: media -> reference          | same MLLM: reference + d1, d2 -> verdict (`compare`) |                 |
| S3       | MLLM: media -> reference          | external LLM: reference + d1, d2 -> verdict (`compare`) |              |
| S4       | MLLM: media -> reference          | external LLM: reasoning (`reason`)       | external LLM: verdict (`extract`) |

A sample with no media runs S1 on the descriptions alone (the prompt says so), and takes its S2-S4 reference
from a reference-description file instead of step 1; with neither, S2-S4 refuse with a clear error.

Every call goes through the `CallCache`: a finished call is never redone, and a killed run resumes where it
stopped. Step-1 references are keyed without strategy and order, so S2, S3 and S4 share them.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from emoreward.data import PreferencePair
from emoreward.evaluation.verdicts import Judgement, Verdict
from zero_shot.backends.base import Backend, ChatRequest, Generation, MediaInput, SamplingConfig
from zero_shot.cache import CallCache, CallKey
from zero_shot.parsing import parse_verdict
from zero_shot.prompts import MediaKind, PromptSet


Strategy = Literal["S1", "S2", "S3", "S4"]
STRATEGIES: tuple[str, ...] = get_args(Strategy)
VERDICT_LABELS = ("1", "2", "tie")
SHARED = "shared"  # strategy field of step-1 cache rows


class MissingReferenceError(ValueError):
    """S2-S4 on a sample with no media and no reference description."""


@dataclass
class CallStats:
    """Counts shown by the progress bar and written to the report."""

    made: int = 0
    cached: int = 0
    failed: int = 0
    started: float = field(default_factory=time.perf_counter)
    prefill_s: float = 0.0
    decode_s: float = 0.0

    @property
    def done(self) -> int:
        return self.made + self.cached

    def postfix(self) -> dict:
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        return {
            "done": self.done,
            "cached": self.cached,
            "failed": self.failed,
            "rate": f"{self.made / elapsed:.2f}/s",
        }


def load_references(path: str | Path) -> dict[str, str]:
    """Reference descriptions for samples without media: JSONL (`sample_id`/`name`, `description`/`reference`)
    or CSV with the same columns.

    Raises:
        ValueError: a row without sample id or description, or a duplicate sample id (names file and row).
    """
    import csv

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"reference-description file not found: {path}")
    if path.suffix.lower() == ".csv":
        with path.open(newline="", encoding="utf-8-sig") as fh:
            rows = list(csv.DictReader(fh))
    else:
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    out: dict[str, str] = {}
    for i, row in enumerate(rows, start=1):
        sample = row.get("sample_id") or row.get("name") or row.get("sample")
        text = row.get("description") or row.get("reference")
        if not sample or not text or not str(text).strip():
            raise ValueError(f"{path}, row {i}: need a sample id (sample_id/name) and a description")
        if str(sample) in out:
            raise ValueError(f"{path}, row {i}: duplicate sample id {sample!r}")
        out[str(sample)] = str(text).strip()
    return out


def resolve_media(pair: PreferencePair, media_root: str | Path | None) -> MediaInput | None:
    """The pair's media as files: paths relative to `media_root`; with no media columns, the MER layout
    `media_root/video/<sample>.mp4` and `media_root/audio/<sample>.wav` when those files exist."""
    root = Path(media_root) if media_root else None

    def find(value: str | None, folder: str, suffixes: tuple[str, ...]) -> str | None:
        if value:
            path = Path(value)
            return str(root / path if root and not path.is_absolute() else path)
        if root:
            for suffix in suffixes:
                candidate = root / folder / f"{pair.sample_id}{suffix}"
                if candidate.exists():
                    return str(candidate)
        return None

    video = find(pair.media.video, "video", (".mp4", ".avi", ".mkv", ".webm"))
    audio = find(pair.media.audio, "audio", (".wav", ".flac", ".mp3"))
    if video is None and audio is None:
        return None
    return MediaInput(video=video, audio=audio, sample_id=pair.sample_id)


def call_seed(base: int, *parts: object) -> int:
    """A per-call seed from the base seed and the call's identity (stable across processes)."""
    digest = hashlib.sha256(repr((base, *parts)).encode()).digest()
    return int.from_bytes(digest[:4], "little")


def media_kind(backend: Backend, media: MediaInput | None) -> MediaKind:
    """What the model is told it sees: `text` with no media, else the backend's choice.

    Raises:
        ValueError: the sample has media but the backend reads only text.
    """
    if media is None or not media.kinds():
        return "text"
    chooser = getattr(backend, "media_kind", None)
    if chooser is None:
        raise ValueError(
            f"{backend.identity} reads only text but the sample has {sorted(media.kinds())}; "
            "run with ignore_media=True (--ignore-media) to judge the descriptions alone"
        )
    return chooser(media)


@dataclass
class _Call:
    key: CallKey
    backend: Backend
    request: ChatRequest
    input_hash: str
    result: Generation | None = None


class ZeroShotJudge:
    """A zero-shot judge running one strategy; implements `emoreward.evaluation.judge.Judge`.

    Args:
        judge_name: the judge definition's name (first field of every cache key).
        strategy: `"S1"`...`"S4"`.
        mllm: backend that sees the media (S1, S2, step 1 of S3/S4).
        llm: external text LLM of S3/S4 (None: the MLLM does those steps too).
        prompts: the prompt set.
        sampling: decoding settings (recorded in reports and input hashes).
        cache: the call cache (an in-memory one when None).
        verdict_mode: `"text"` parses the answer; `"logits"` reads p(1), p(2), p(tie) of the answer tokens.
        references: sample id -> reference description for samples without media (S2-S4).
        media_root: folder media paths are relative to.
        ignore_media: judge on the descriptions alone even when media exists.
        chunk_size: calls per backend batch; the partition into chunks is fixed over the full call list, so
            a resumed run batches (and seeds) its missing calls as the uninterrupted run would.
        progress: a tqdm bar to update (optional); `stats` holds the counts either way.

    Raises:
        ValueError: unknown strategy or verdict mode.
    """

    def __init__(
        self,
        judge_name: str,
        strategy: Strategy,
        *,
        mllm: Backend,
        llm: Backend | None = None,
        prompts: PromptSet,
        sampling: SamplingConfig | None = None,
        cache: CallCache | None = None,
        verdict_mode: Literal["text", "logits"] = "text",
        references: dict[str, str] | None = None,
        media_root: str | Path | None = None,
        ignore_media: bool = False,
        chunk_size: int = 8,
        progress=None,
        stats: CallStats | None = None,
    ):
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {strategy!r}; available: {list(STRATEGIES)}")
        if verdict_mode not in ("text", "logits"):
            raise ValueError(f"unknown verdict mode {verdict_mode!r}; available: ['text', 'logits']")
        self.judge_name = judge_name
        self.strategy = strategy
        self.name = f"{judge_name}/{strategy}"
        self.mllm = mllm
        self.llm = llm if llm is not None else mllm
        self.prompts = prompts
        self.sampling = sampling or SamplingConfig()
        self.cache = cache if cache is not None else CallCache(None)
        self.verdict_mode = verdict_mode
        self.references = references or {}
        self.media_root = media_root
        self.ignore_media = ignore_media
        self.chunk_size = chunk_size
        self.progress = progress
        self.stats = stats or CallStats()
        self._originals: dict[str, tuple[str, str]] = {}
        self._references: dict[tuple[str, int], tuple[str | None, str]] = {}  # (sample, run) -> step-1 result

    # ------------------------------------------------------------------ orders
    def register(self, pairs: Sequence[PreferencePair]) -> None:
        """Record the original order of each pair (the harness later passes swapped copies)."""
        for p in pairs:
            self._originals.setdefault(p.sample_id, (p.description_1, p.description_2))

    def _order(self, pair: PreferencePair) -> str:
        original = self._originals.setdefault(pair.sample_id, (pair.description_1, pair.description_2))
        if (pair.description_1, pair.description_2) == original:
            return "normal"
        if (pair.description_2, pair.description_1) == original:
            return "swapped"
        raise ValueError(f"sample {pair.sample_id!r} was seen before with other descriptions")

    # ------------------------------------------------------------------ planning
    def n_calls_per_pair_order(self) -> int:
        """Calls per pair, order and run, not counting the shared step 1 (S1: 1, S2/S3: 1, S4: 2)."""
        return 2 if self.strategy == "S4" else 1

    def _media(self, pair: PreferencePair) -> MediaInput | None:
        return None if self.ignore_media else resolve_media(pair, self.media_root)

    def _hash(self, backend: Backend, request: ChatRequest, step: str) -> str:
        media = request.media
        media_id = None
        if media is not None:
            media_id = [
                (p, os.path.getsize(p) if p and os.path.exists(p) else None) for p in (media.video, media.audio)
            ]
            if media.frames is not None or media.waveform is not None:
                media_id.append(("arrays", hashlib.sha256(repr((media.frames, media.waveform)).encode()).hexdigest()))
        blob = json.dumps(
            [
                backend.identity,
                step,
                request.system,
                request.prompt,
                media_id,
                self.sampling.as_dict(),
                request.score_labels,
                request.answer_prefix,
                self.prompts.tag,
            ],
            sort_keys=True,
            default=str,
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def _make_call(self, backend, step, strategy, pair, order, run, prompt, media=None, final=False) -> _Call:
        key = CallKey(self.judge_name, strategy, step, pair.sample_id, order, run)
        seed = call_seed(self.sampling.seed, strategy, step, pair.sample_id, order, run)
        logits = final and self.verdict_mode == "logits"
        request = ChatRequest(
            prompt=prompt,
            system=self.prompts.system,
            media=media,
            seed=seed,
            score_labels=VERDICT_LABELS if logits else None,
            answer_prefix=self.prompts.logit_answer_prefix if logits else "",
        )
        return _Call(key, backend, request, self._hash(backend, request, step))

    def _execute(self, calls: list[_Call]) -> None:
        """Fill `call.result` for every call: cache hits first, then the missing ones in fixed chunks."""
        for call in calls:
            row = self.cache.get(call.key, call.input_hash)
            if row is not None:
                call.result = Generation(text=row["output"], probs=row.get("probs"))
                self.stats.cached += 1
                self._tick()
        for start in range(0, len(calls), self.chunk_size):
            chunk = [c for c in calls[start : start + self.chunk_size] if c.result is None]
            by_backend: dict[int, list[_Call]] = {}
            for c in chunk:
                by_backend.setdefault(id(c.backend), []).append(c)
            for group in by_backend.values():
                gens = group[0].backend.generate([c.request for c in group], self.sampling)
                if len(gens) != len(group):
                    raise RuntimeError(f"backend returned {len(gens)} generations for {len(group)} requests")
                for c, g in zip(group, gens):
                    c.result = g
                    if g.error is None:
                        meta = {"prompt_tokens": g.prompt_tokens, "completion_tokens": g.completion_tokens}
                        self.cache.put(c.key, c.input_hash, g.text, g.probs, meta)
                        self.stats.made += 1
                        self.stats.prefill_s += g.prefill_s or 0.0
                        self.stats.decode_s += g.decode_s or 0.0
                    else:
                        self.stats.failed += 1
                    self._tick()

    def _tick(self) -> None:
        if self.progress is not None:
            self.progress.update(1)
            self.progress.set_postfix(self.stats.postfix(), refresh=False)

    # ------------------------------------------------------------------ steps
    def references_for(self, pairs: Sequence[PreferencePair], run: int) -> dict[str, tuple[str | None, str]]:
        """Step 1 of S2-S4: sample id -> (reference or None when the call failed, source `model`/`file`/error).

        Raises:
            MissingReferenceError: a sample without media has no reference description.
        """
        out: dict[str, tuple[str | None, str]] = {}
        calls: list[tuple[str, _Call]] = []
        missing = []
        for pair in dict((p.sample_id, p) for p in pairs).values():
            if (pair.sample_id, run) in self._references:  # the swapped order reuses the normal order's step 1
                out[pair.sample_id] = self._references[(pair.sample_id, run)]
                continue
            media = self._media(pair)
            if media is None:
                if pair.sample_id in self.references:
                    out[pair.sample_id] = (self.references[pair.sample_id], "file")
                else:
                    missing.append(pair.sample_id)
                continue
            prompt = self.prompts.render("describe", media=media_kind(self.mllm, media), subtitle=pair.media.subtitle)
            calls.append(
                (pair.sample_id, self._make_call(self.mllm, "describe", SHARED, pair, "-", run, prompt, media))
            )
        if missing:
            raise MissingReferenceError(
                f"{self.strategy} needs media or a reference description for every sample; {len(missing)} samples "
                f"have neither (e.g. {missing[:3]}). Pass a reference-description file (--references FILE.jsonl "
                "with sample_id and description) or media (--media-root DIR)"
            )
        self._execute([c for _, c in calls])
        for sample, call in calls:
            g = call.result
            out[sample] = (g.text, "model") if g is not None and g.error is None else (None, f"error: {g and g.error}")
            if out[sample][0] is not None:
                self._references[(sample, run)] = out[sample]
        return out

    def judge(self, pairs: Sequence[PreferencePair], *, run: int = 0) -> list[Judgement]:
        """One verdict per pair (in the order given) for run `run`; see the class docstring."""
        pairs = list(pairs)
        orders = [self._order(p) for p in pairs]
        steps: list[dict[str, str]] = [{} for _ in pairs]
        final: list[_Call | None] = [None] * len(pairs)
        if self.strategy == "S1":
            for i, (p, order) in enumerate(zip(pairs, orders)):
                media = self._media(p)
                prompt = self.prompts.render(
                    "compare_media",
                    media=media_kind(self.mllm, media),
                    subtitle=p.media.subtitle,
                    description_1=p.description_1,
                    description_2=p.description_2,
                )
                steps[i]["input"] = "media" if media is not None else "text-only"
                final[i] = self._make_call(self.mllm, "compare", "S1", p, order, run, prompt, media, final=True)
            self._execute([c for c in final if c is not None])
        else:
            refs = self.references_for(pairs, run)
            backend = self.mllm if self.strategy == "S2" else self.llm
            first: list[_Call | None] = [None] * len(pairs)
            for i, (p, order) in enumerate(zip(pairs, orders)):
                reference, source = refs[p.sample_id]
                steps[i]["reference_source"] = source
                if reference is None:
                    continue
                steps[i]["reference"] = reference
                fields = {"reference": reference, "description_1": p.description_1, "description_2": p.description_2}
                if self.strategy == "S4":
                    prompt = self.prompts.render("reason_reference", **fields)
                    first[i] = self._make_call(backend, "reason", "S4", p, order, run, prompt)
                else:
                    prompt = self.prompts.render("compare_reference", **fields)
                    final[i] = self._make_call(backend, "compare", self.strategy, p, order, run, prompt, final=True)
            if self.strategy == "S4":
                self._execute([c for c in first if c is not None])
                for i, (p, order) in enumerate(zip(pairs, orders)):
                    call = first[i]
                    if call is None or call.result is None or call.result.error is not None:
                        continue
                    steps[i]["reasoning"] = call.result.text
                    prompt = self.prompts.render("extract_answer", reasoning=call.result.text)
                    final[i] = self._make_call(backend, "extract", "S4", p, order, run, prompt, final=True)
            self._execute([c for c in final if c is not None])
        return [self._judgement(p, order, run, call, s) for p, order, call, s in zip(pairs, orders, final, steps)]

    def _judgement(self, pair, order, run, call: _Call | None, steps: dict[str, str]) -> Judgement:
        g = call.result if call is not None else None
        if g is None or g.error is not None:
            error = g.error if g is not None else "an earlier step failed"
            return Judgement(
                pair.sample_id, Verdict.INVALID, order=order, run=run, raw=None, steps={**steps, "error": str(error)}
            )
        probs = g.probs or {}
        verdict = parse_verdict(g.text)
        return Judgement(
            pair.sample_id,
            verdict,
            order=order,
            run=run,
            p_first=probs.get("1"),
            p_second=probs.get("2"),
            p_tie=probs.get("tie"),
            raw=g.text,
            steps=steps,
        )
