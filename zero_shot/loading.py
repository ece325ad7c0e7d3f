"""`load_judge`: a YAML-defined zero-shot judge as a ready `Judge` (name + `judge(pairs, run=...)`), with its call
cache on disk, for any caller of the shared harness (`emoreward rank`, `emoreward.judges.load_judge`, notebooks).

    judge = load_judge("smollm2-135m-text", strategy="S1", cache_dir="~/.cache/emoreward/judges")
    result = run_judge(judge, pairs, swap=True, runs=1)

The cache file is `<cache_dir>/zero-shot/<judge name>-<fingerprint>.jsonl`, the fingerprint hashing what decides
an answer (backend identities, decoding settings, prompt set and its templates, verdict mode): editing a judge
definition starts a new file instead of clashing with the old calls, and a killed run resumes from the file.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Literal

from zero_shot.backends.base import Backend
from zero_shot.cache import CallCache
from zero_shot.config import JudgeConfig, LazyBackend, load_judge_config, trust_judge_code
from zero_shot.prompts import load_prompts
from zero_shot.strategies import STRATEGIES, CallStats, ZeroShotJudge, default_chunk_size, load_references


def judge_fingerprint(config: JudgeConfig) -> str:
    """12 hex digits naming what decides a judge's answers (see the module docstring)."""
    from zero_shot.config import backend_identity

    prompts = load_prompts(config.prompts)
    blob = json.dumps(
        [
            backend_identity(config.mllm),
            backend_identity(config.llm) if config.llm is not None else None,
            config.sampling.as_dict(),
            prompts.tag,
            prompts.digest,
            config.verdict,
        ],
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def judge_cache_path(config: JudgeConfig, cache_dir: str | Path) -> Path:
    """`<cache_dir>/zero-shot/<name>-<fingerprint>.jsonl`."""
    return Path(cache_dir).expanduser() / "zero-shot" / f"{config.name}-{judge_fingerprint(config)}.jsonl"


def load_judge(
    spec: str | Path | JudgeConfig,
    *,
    strategy: str = "S1",
    cache_dir: str | Path | None = None,
    references: str | Path | dict[str, str] | None = None,
    media_root: str | Path | None = None,
    ignore_media: bool = False,
    on_failed_call: Literal["invalid", "raise"] = "raise",
    progress: bool = False,
    backends: dict[str, Backend] | None = None,
    trust_remote_code: bool = False,
) -> ZeroShotJudge:
    """A zero-shot judge from a judge YAML path, a registered judge name (`configs/judges/<name>.yaml`) or a parsed
    `JudgeConfig`, running one strategy through a call cache.

    Args:
        strategy: `"S1"` (default: the MLLM compares the two descriptions) ... `"S4"`.
        cache_dir: folder of the call cache (`judge_cache_path`); None keeps calls in memory (no resume).
        references: reference descriptions (file or sample id -> text) for S2-S4 samples without media.
        media_root: folder media paths are relative to (MER layout `video/<id>.mp4`, `audio/<id>.wav`).
        ignore_media: judge from the descriptions alone.
        on_failed_call: `"raise"` (default): a failed call raises `JudgeCallError` once the finished calls are
            cached (a ranking must not silently drop comparisons); `"invalid"`: an INVALID verdict, counted.
        progress: show a tqdm bar of calls (made / cached / failed) on stderr.
        backends: `{"mllm": ..., "llm": ...}` instead of building them from the config (models load lazily
            otherwise: a fully cached run loads none).
        trust_remote_code: the user asks for the judge's models to run their repositories' code (a judge file
            cannot; `zero_shot.config.trust_judge_code`).

    Returns:
        `ZeroShotJudge` (the `emoreward.evaluation.judge.Judge` protocol), with `cache_path` (or None), `config`
        and `stats` (`CallStats`: made, cached, reused, failed).

    Raises:
        ValueError: unknown judge name (lists the registered ones), invalid definition (names file, line and
            field), unknown strategy.
        FileNotFoundError: a judge or references path that does not exist.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; available: {list(STRATEGIES)}")
    if isinstance(spec, JudgeConfig):
        config = trust_judge_code(spec) if trust_remote_code else spec
    else:
        config = load_judge_config(spec, trust_remote_code=trust_remote_code)
    refs = load_references(references) if isinstance(references, (str, Path)) else references
    backends = dict(backends or {})
    backends.setdefault("mllm", LazyBackend(config.mllm))
    if config.llm is not None and strategy in ("S3", "S4"):
        backends.setdefault("llm", LazyBackend(config.llm))
    cache_path = judge_cache_path(config, cache_dir) if cache_dir is not None else None
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(desc=f"judge {config.name}/{strategy}", unit="call", dynamic_ncols=True)
    mllm = backends["mllm"]
    judge = ZeroShotJudge(
        config.name,
        strategy,  # type: ignore[arg-type]
        mllm=mllm,
        llm=backends.get("llm"),
        prompts=load_prompts(config.prompts),
        sampling=config.sampling,
        cache=CallCache(cache_path),
        verdict_mode=config.verdict,
        references=refs,
        media_root=media_root,
        ignore_media=ignore_media,
        chunk_size=default_chunk_size(mllm),
        progress=bar,
        stats=CallStats(),
        on_failed_call=on_failed_call,
    )
    judge.cache_path = cache_path
    judge.config = config
    return judge


__all__ = ["judge_cache_path", "judge_fingerprint", "load_judge"]
