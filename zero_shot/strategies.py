"""The zero-shot judge: strategies S1-S4 (EmoPrefer, section 4.1 and appendix D) behind the `Judge` protocol.

S1: the MLLM compares the two descriptions with the media; S2: the MLLM writes a reference description, then
compares; S3: an external text LLM compares against that reference; S4: the text LLM reasons, then gives the
verdict. `ZeroShotJudge` runs one strategy (its docstring gives the steps, the cache keys and what a failed call
becomes). Every call goes through the `CallCache`, so a killed run resumes where it stopped.
See docs/judges.md.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from emoreward.data import PreferencePair
from emoreward.data.text import normal_name
from emoreward.data.verdicts import Judgement, Verdict
from zero_shot.backends.base import Backend, ChatRequest, Generation, MediaInput, SamplingConfig, scrub_secrets
from zero_shot.cache import CallCache, CallKey, call_input_hash, media_array_digest
from zero_shot.parsing import parse_verdict
from zero_shot.prompts import MediaKind, PromptSet


Strategy = Literal["S1", "S2", "S3", "S4"]
STRATEGIES: tuple[str, ...] = get_args(Strategy)
# the strategies whose step 1 is a reference description (from the media, or a `--references` file without them)
READS_REFERENCES: frozenset[str] = frozenset({"S2", "S3", "S4"})
VERDICT_LABELS = ("1", "2", "tie")
SHARED = "shared"  # strategy field of step-1 cache rows


class MissingReferenceError(ValueError):
    """S2-S4 on a sample with no media and no reference description."""


class JudgeCallError(RuntimeError):
    """Judge calls failed in a way a rerun of the same run cannot fix alone (a fatal backend error, e.g. HTTP 401),
    or failed while the judge was asked to stop on failures (`on_failed_call="raise"`). Finished calls are cached."""


@dataclass
class CallStats:
    """Counts shown by the progress bar and written to the report."""

    made: int = 0
    cached: int = 0
    reused: int = 0  # greedy runs 2..R answered by run 0's calls
    failed: int = 0
    started: float = field(default_factory=time.perf_counter)
    prefill_s: float = 0.0
    decode_s: float = 0.0

    @property
    def done(self) -> int:
        return self.made + self.cached + self.reused

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
        FileNotFoundError: the file does not exist.
        ValueError: malformed JSON, undecodable bytes, a row without sample id or description, a value that is
            not text, or a duplicate sample id; the message names the file, its line (JSONL: the line in the file;
            CSV: the line the row starts on, the header being line 1) and the field.
    """
    import csv

    from emoreward.data.readers import locate_undecodable

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"reference-description file not found: {path}")
    is_csv = path.suffix.lower() == ".csv"
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        field = locate_undecodable(raw, err.start, "csv" if is_csv else "jsonl")[1]
        where = f", field {field!r}" if field else ""
        raise ValueError(
            f"{path}, line {line}{where}: undecodable bytes {raw[err.start : err.end]!r} (the file must be UTF-8)"
        ) from None
    rows: list[tuple[int, object]] = []
    if is_csv:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        start = 2
        for row in reader:
            rows.append((start, row))
            start = reader.line_num + 1
    else:
        # lines end at "\n" only: a U+2028 inside a JSON string is text
        for number, line in enumerate(text.split("\n"), start=1):
            if not line.strip():
                continue
            try:
                rows.append((number, json.loads(line)))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}, line {number}: malformed JSON ({err.msg}, column {err.colno})") from None
    out: dict[str, str] = {}
    first: dict[str, int] = {}
    for number, row in rows:
        if not isinstance(row, dict):
            raise ValueError(f"{path}, line {number}: expected a JSON object, got {type(row).__name__}")
        values = {}
        for names in (("sample_id", "name", "sample"), ("description", "reference")):
            name = next((n for n in names if row.get(n) not in (None, "")), names[0])
            value = row.get(name)
            if value is None or (isinstance(value, str) and not value.strip()):
                raise ValueError(f"{path}, line {number}, field {name!r}: missing (one of {list(names)} is needed)")
            if not isinstance(value, str) and not (names[0] == "sample_id" and type(value) is int):
                raise ValueError(f"{path}, line {number}, field {name!r}: expected text, got {type(value).__name__}")
            values[names[0]] = (name, str(value).strip())
        (id_field, sample), (_, description) = values["sample_id"], values["description"]
        sample = normal_name(sample)  # as the pairs' sample ids are read
        if sample in out:
            raise ValueError(
                f"{path}, line {number}, field {id_field!r}: duplicate sample id {sample!r} (first on line "
                f"{first[sample]})"
            )
        out[sample], first[sample] = description, number
    return out


def resolve_media(pair: PreferencePair, media_root: str | Path | None) -> MediaInput | None:
    """The pair's media as files: paths relative to `media_root`; with no media columns, the MER layout
    (`emoreward.data.media.layout_path`: `media_root/video/<sample>.mp4`, `media_root/audio/<sample>.wav`, the
    files a reward model reads) when those files exist."""
    from emoreward.data.media import layout_path

    root = Path(media_root) if media_root else None

    def find(value: str | None, kind: str) -> str | None:
        if value:
            path = Path(value)
            return str(root / path if root and not path.is_absolute() else path)
        if root and (root / layout_path(pair.sample_id, kind)).exists():
            return str(root / layout_path(pair.sample_id, kind))
        return None

    video = find(pair.media.video, "video")
    audio = find(pair.media.audio, "audio")
    if video is None and audio is None:
        return None
    return MediaInput(video=video, audio=audio, sample_id=pair.sample_id)


def call_seed(base: int, *parts: object) -> int:
    """A per-call seed from the base seed and the call's content (`parts`: stable across processes)."""
    digest = hashlib.sha256(repr((base, *parts)).encode()).digest()
    return int.from_bytes(digest[:4], "little")


def compare_prompt(prompts: PromptSet, pair: PreferencePair, media: MediaKind = "text") -> str:
    """S1's question for a pair (template `compare_media`: the media hint, the subtitle line, both descriptions in
    the pair's order): what a zero-shot judge is asked and what a trained judge learns to answer
    (`emoreward.training.judge`)."""
    return prompts.render(
        "compare_media",
        media=media,
        subtitle=pair.media.subtitle,
        description_1=pair.description_1,
        description_2=pair.description_2,
    )


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


CHUNK_BATCHES = 4  # a chunk of calls is this many backend batches: room to group prompts of similar length


def default_chunk_size(backend: Backend) -> int:
    """Calls handed to a backend at once: `CHUNK_BATCHES` batches (local models, which sort a chunk's prompts by
    length into batches) or the concurrency (HTTP), whichever is larger. A chunk's calls are cached when it
    returns, so a kill loses at most one chunk."""
    return max(CHUNK_BATCHES * getattr(backend, "batch_size", 2), getattr(backend, "concurrency", 1))


@dataclass
class _Call:
    key: CallKey
    backend: Backend
    request: ChatRequest
    input_hash: str
    run: int = 0  # the run asking (the key's run is 0 when greedy runs share run 0's calls)
    result: Generation | None = None


class ZeroShotJudge:
    """A zero-shot judge running one strategy; implements `emoreward.evaluation.judge.Judge`.

    | strategy | step 1 (`describe`, shared) | step 2                                                  | step 3            |
    |----------|-----------------------------|---------------------------------------------------------|-------------------|
    | S1       | MLLM: media + d1, d2 -> verdict (`compare`) |                                         |                   |
    | S2       | MLLM: media -> reference    | same MLLM: reference + d1, d2 -> verdict (`compare`)    |                   |
    | S3       | MLLM: media -> reference    | external LLM: reference + d1, d2 -> verdict (`compare`) |                   |
    | S4       | MLLM: media -> reference    | external LLM: reasoning (`reason`)                      | external LLM:     |
    |          |                             |                                                         | verdict (`extract`) |

    A sample with no media runs S1 on the descriptions alone (the prompt says so), and takes its S2-S4 reference
    from a reference-description file instead of step 1; with neither, S2-S4 refuse with a clear error.

    Call cache: a call is found by its content (`CallKey.content`: strategy, step, run and `call_input_hash`, the
    prompt with the descriptions in the order shown), never by the sample, model or order names it carries for logs:
    renamed models, a subset of an earlier run or a shuffled table reuse its calls, and identical calls within one
    batch are made once. Step-1 references are stored under strategy `shared`, so S2-S4 share them. With greedy decoding
    (`do_sample: false`) every repeated run reuses run 0's calls, so runs 2..R cost nothing and multi-run
    consistency is 100% by construction, not a measurement.

    Failed calls: a fatal backend error (HTTP 401/403/404) stops the run with `JudgeCallError`; other failures are
    counted (`CallStats.failed`), never cached, and become INVALID verdicts whose `steps["error"]` says why
    (secrets scrubbed), or, with `on_failed_call="raise"`, a `JudgeCallError` once the finished calls of the batch
    are cached.

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
        on_failed_call: `"invalid"` (default): a failed call is an INVALID verdict, counted apart from unparseable
            answers; `"raise"`: `judge` raises `JudgeCallError` after caching the calls that succeeded (rankings,
            which must not silently drop comparisons).
        reuse_greedy_runs: with greedy decoding, runs >= 1 reuse run 0's calls (default True).

    Raises:
        ValueError: unknown strategy, verdict mode or `on_failed_call`.
    """

    cache_path: Path | None = None  # set by `zero_shot.load_judge`: where the call cache lives
    config = None  # set by `zero_shot.load_judge`: the `JudgeConfig` it was built from

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
        on_failed_call: Literal["invalid", "raise"] = "invalid",
        reuse_greedy_runs: bool = True,
    ):
        if on_failed_call not in ("invalid", "raise"):
            raise ValueError(f"on_failed_call: unknown {on_failed_call!r}; available: ['invalid', 'raise']")
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
        self.on_failed_call = on_failed_call
        self.reuse_greedy_runs = reuse_greedy_runs
        self._originals: dict[tuple, tuple] = {}
        self._several: set[tuple] = set()  # (sample, writers) with several pairs: their keys carry the content
        self._references: dict[tuple[str, int], tuple[str | None, str]] = {}  # (sample, run) -> step-1 result

    # ------------------------------------------------------------------ orders
    def register(self, pairs: Sequence[PreferencePair]) -> None:
        """Record the original order of each pair (the harness later passes swapped copies). A sample with several
        pairs by the same writers (or none named) keys each by its content (`pair_content`), in any row order."""
        from emoreward.data.pairs import pair_content

        contents: dict[tuple, set] = {}
        for p in pairs:
            contents.setdefault(self._base_ident(p), set()).add(pair_content(p))
        self._several |= {ident for ident, found in contents.items() if len(found) > 1}
        for p in pairs:
            self._identify(p)

    @property
    def greedy(self) -> bool:
        """Whether repeated runs reuse run 0's calls (greedy decoding: a call's answer cannot change)."""
        return self.reuse_greedy_runs and not self.sampling.do_sample

    @staticmethod
    def _base_ident(pair: PreferencePair) -> tuple:
        writers = None if pair.model_1 is None or pair.model_2 is None else frozenset((pair.model_1, pair.model_2))
        return (pair.sample_id, writers)

    def _identify(self, pair: PreferencePair) -> tuple[str, str]:
        """(the pair's key in the call cache, `"normal"` or `"swapped"` relative to the first order seen)."""
        ident = self._base_ident(pair)
        suffix = ""
        first = self._originals.get(ident)
        here = (pair.model_1, pair.model_2, pair.description_1, pair.description_2)
        if first is not None and here not in (first, (first[1], first[0], first[3], first[2])):
            self._several.add(ident)  # another pair of a sample seen before (a later call): keyed by its content
        if ident in self._several:
            import hashlib

            from emoreward.data.pairs import pair_content

            content = pair_content(pair)
            ident, suffix = (*ident, content), "|" + hashlib.sha1(repr(content).encode("utf-8")).hexdigest()[:12]
        original = self._originals.setdefault(
            ident, (pair.model_1, pair.model_2, pair.description_1, pair.description_2)
        )
        key = pair.sample_id if ident[1] is None else f"{pair.sample_id}|{original[0]}|{original[1]}"
        key += suffix
        if here == original:
            return key, "normal"
        if (pair.model_2, pair.model_1, pair.description_2, pair.description_1) == original:
            return key, "swapped"
        raise ValueError(f"sample {pair.sample_id!r} was seen before with other descriptions (pair {key})")

    def _order(self, pair: PreferencePair) -> str:
        return self._identify(pair)[1]

    # ------------------------------------------------------------------ planning
    def n_calls_per_pair_order(self) -> int:
        """Calls per pair, order and run, not counting the shared step 1 (S1: 1, S2/S3: 1, S4: 2)."""
        return 2 if self.strategy == "S4" else 1

    def _media(self, pair: PreferencePair) -> MediaInput | None:
        return None if self.ignore_media else resolve_media(pair, self.media_root)

    def _hash(self, backend: Backend, request: ChatRequest, step: str) -> str:
        from emoreward.models.media.cache import file_digest

        media = request.media
        media_id = None
        if media is not None:
            media_id = [(p, file_digest(p) if p and os.path.isfile(p) else None) for p in (media.video, media.audio)]
            if media.frames is not None or media.waveform is not None:
                media_id.append(("arrays", [media_array_digest(media.frames), media_array_digest(media.waveform)]))
        return call_input_hash(
            backend=backend,
            step=step,
            system=request.system,
            prompt=request.prompt,
            media=media_id,
            sampling=self.sampling.as_dict(),
            score_labels=request.score_labels,
            answer_prefix=request.answer_prefix,
            prompts_tag=self.prompts.tag,
        )

    def _content_seed(self, strategy: str, step: str, prompt: str, media: MediaInput | None, logits: bool, run: int):
        """A sampling call's seed from what the call reads (the base seed, strategy, step, system prompt, prompt, the
        media files' content, the verdict mode) and its run: never from a sample's or a model's name or a pair's
        position, so renaming samples or models, or reordering rows, leaves every sampled answer as it was."""
        from emoreward.models.media.cache import file_digest

        media_id = None
        if media is not None:
            media_id = [file_digest(p) if p and os.path.isfile(p) else None for p in (media.video, media.audio)]
            media_id += [media_array_digest(media.frames), media_array_digest(media.waveform)]
        return call_seed(self.sampling.seed, strategy, step, self.prompts.system, prompt, media_id, logits, run)

    def _make_call(self, backend, step, strategy, pair, order, run, prompt, media=None, final=False) -> _Call:
        sample = pair.sample_id if step == "describe" else self._identify(pair)[0]
        key_run = 0 if self.greedy else run
        key = CallKey(self.judge_name, strategy, step, sample, order, key_run)
        logits = final and self.verdict_mode == "logits"
        seed = self._content_seed(strategy, step, prompt, media, logits, key_run)
        request = ChatRequest(
            prompt=prompt,
            system=self.prompts.system,
            media=media,
            seed=seed,
            score_labels=VERDICT_LABELS if logits else None,
            answer_prefix=self.prompts.logit_answer_prefix if logits else "",
        )
        return _Call(key, backend, request, self._hash(backend, request, step), run=run)

    def _execute(self, calls: list[_Call]) -> None:
        """Fill `call.result` for every call: cache hits first, then the missing ones in fixed chunks."""
        for call in calls:
            row = self.cache.get(call.key, call.input_hash)
            if row is not None:
                call.result = Generation(text=row["output"], probs=row.get("probs"))
                if call.run != call.key.run:
                    self.stats.reused += 1
                else:
                    self.stats.cached += 1
                self._tick()
        made: dict[tuple, _Call] = {}  # content -> the call of this batch that asks it (made once)
        for start in range(0, len(calls), self.chunk_size):
            chunk, twins = [], []
            for c in calls[start : start + self.chunk_size]:
                if c.result is not None:
                    continue
                first = made.setdefault(c.key.content(c.input_hash), c)
                (chunk if first is c else twins).append(c)
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
                        g.error = scrub_secrets(g.error)
                        self.stats.failed += 1
                    self._tick()
                broken = next((c for c, g in zip(group, gens) if g.broken_model), None)
                if broken is not None:  # the model, not the call: a rerun would ask the same weights again
                    raise JudgeCallError(
                        f"{self.name}: {broken.result.error} for sample {broken.key.sample!r} (order "
                        f"{broken.key.order}): the model's weights are broken (a diverged training run?); stopped, "
                        "nothing of this call cached: retrain the judge (e.g. with a lower learning_rate)"
                    )
                fatal = next((g for g in gens if g.error is not None and g.fatal), None)
                if fatal is not None:
                    raise JudgeCallError(
                        f"{group[0].backend.identity} refused the call: {fatal.error}. Stopped; no further calls "
                        "made (check the judge's base_url, model and api_key_env). Finished calls are cached."
                    )
            for c in twins:  # the same input as a call made above: its answer, counted as answered without a call
                c.result = made[c.key.content(c.input_hash)].result
                if c.result is None or c.result.error is not None:
                    self.stats.failed += 1
                else:
                    self.stats.cached += 1
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
        if self.strategy not in READS_REFERENCES:
            for i, (p, order) in enumerate(zip(pairs, orders)):
                media = self._media(p)
                prompt = compare_prompt(self.prompts, p, media_kind(self.mllm, media))
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
        out = [self._judgement(p, order, run, call, s) for p, order, call, s in zip(pairs, orders, final, steps)]
        if self.on_failed_call == "raise":
            failed = [j for j in out if "error" in j.steps]
            if failed:
                raise JudgeCallError(
                    f"{self.name}: {len(failed)} of {len(out)} judge calls failed (e.g. sample "
                    f"{failed[0].sample_id!r}: {failed[0].steps['error']}). The finished calls are cached: run the "
                    "same command again to retry the failed ones"
                )
        return out

    def _judgement(self, pair, order, run, call: _Call | None, steps: dict[str, str]) -> Judgement:
        g = call.result if call is not None else None
        if g is None or g.error is not None:
            error = scrub_secrets(str(g.error)) if g is not None else "an earlier step failed"
            return Judgement(
                pair.sample_id, Verdict.INVALID, order=order, run=run, raw=None, steps={**steps, "error": error}
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
