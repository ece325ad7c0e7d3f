"""Run a YAML-defined zero-shot judge over preference pairs with strategies S1-S4, and write the report.

    result = run_zero_shot(load_judge_config("smollm2-135m-text"), load_pairs("emoprefer"), ["S1"],
                           runs=2, output_dir="outputs/judge-smollm2")
    print(result["markdown"])

Each strategy runs through `emoreward.evaluation.harness.run_judge` (normal + swapped order, R runs), so the
numbers are computed by the same code as a reward model's. Every model call lands in
`output_dir/calls.jsonl` (see `zero_shot.cache`); rerunning the same command resumes from it.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path

from emoreward.data import PreferencePair
from emoreward.data.negatives import Negative
from emoreward.data.text import markdown_cell
from emoreward.evaluation import metrics
from emoreward.evaluation.controlled import ControlledSet, controlled_markdown
from emoreward.evaluation.cost import CostLedger
from emoreward.evaluation.harness import JudgementSet, controlled_errors, evaluate_judgements, run_judge
from emoreward.evaluation.report import weighting_note
from emoreward.utils.io import atomic_write_json, atomic_write_text
from zero_shot.backends.base import Backend
from zero_shot.cache import CallCache
from zero_shot.config import JudgeConfig, LazyBackend
from zero_shot.crowd import combine_normal_swapped, crowd_member, crowdsource, per_run_summary
from zero_shot.prompts import load_prompts
from zero_shot.strategies import READS_REFERENCES, STRATEGIES, CallStats, ZeroShotJudge, default_chunk_size


logger = logging.getLogger(__name__)
CACHE_FILE = "calls.jsonl"
# every file a run writes in its output folder: a folder holding anything else is not this command's to write into
# (`emoreward.cli.options.check_output_dir`)
OUTPUT_FILES = (CACHE_FILE, "judgements_*.jsonl", "report.json", "report.md")
NS_RUNS = 2  # the normal+swapped combination: majority over this many runs of each order (EmoPrefer: 2 + 2)


def judgement_rows(result: JudgementSet) -> list[dict]:
    """Flat JSON-safe rows (one per pair, order and run) for `judgements.jsonl`."""
    rows = []
    for order, runs in (("normal", result.normal), ("swapped", result.swapped)):
        for run in runs:
            for j in run:
                rows.append(
                    {
                        "judge": result.judge_name,
                        "sample_id": j.sample_id,
                        "order": order,
                        "run": j.run,
                        "verdict": j.verdict.value,
                        "p_first": j.p_first,
                        "p_second": j.p_second,
                        "p_tie": j.p_tie,
                        "raw": j.raw,
                        "steps": j.steps,
                    }
                )
    return rows


def summarize(
    result: JudgementSet, strategy: str, tie_policy: metrics.TiePolicy = "wrong", media_by_id: bool = False
) -> dict:
    """Evaluation of one judge and strategy: the harness report plus mean ± std over runs, the normal+swapped
    combination (when 2 normal and 2 swapped runs exist) and invalid counts."""
    evaluation = evaluate_judgements(result, tie_policy=tie_policy, media_by_id=media_by_id)
    out = {"strategy": strategy, "evaluation": evaluation, "per_run": per_run_summary(result, tie_policy)}
    if len(result.normal) >= NS_RUNS and len(result.swapped) >= NS_RUNS:
        y_true = [p.label for p in result.pairs]
        combined = combine_normal_swapped(result, tie_break="tie", n_runs=NS_RUNS)
        out["normal_swapped"] = {
            "n_runs": NS_RUNS,  # per order: what `table_note` says the N+S column is over
            "tie_break": "tie",
            "two_class": metrics.recognition(y_true, combined, "two-class", tie_policy),
            "three_class": metrics.recognition(y_true, combined, "three-class", tie_policy),
        }
    return out


def _cell(stat: dict | None) -> str:
    if stat is None:
        return "-"
    if isinstance(stat, dict):
        return f"{stat['mean']:.2f}±{stat['std']:.2f}" if stat.get("n", 1) > 1 else f"{stat['mean']:.2f}"
    return f"{stat:.2f}"


def table2_markdown(judge_name: str, summaries: Sequence[dict]) -> str:
    """A table in the layout of EmoPrefer Table 2 (model, strategy, two-class WAF/ACC, three-class WAF/ACC, swap
    consistency; mean ± std over runs), with extra columns (multi-run consistency, normal+swapped two-class
    WAF, preference for the longer description, invalid verdicts per run) and the length-baseline row."""
    head = (
        "| Model | S. | 2-class WAF | 2-class ACC | 3-class WAF | 3-class ACC | Swap cons. | Multi-run cons. "
        "| N+S 2-class WAF | Prefers longer | Unparseable/run | Failed calls/run |"
    )
    lines = [head, "|---|---|" + "---:|" * 10]
    for s in summaries:
        pr = s["per_run"]
        ns = s.get("normal_swapped")
        multi = (
            "100 (greedy, by construction)" if s.get("greedy_runs_reused") else _cell(pr.get("multi_run_consistency"))
        )
        lines.append(
            f"| {markdown_cell(judge_name)} | {s['strategy']} | {_cell(pr['2c_waf'])} | {_cell(pr['2c_acc'])} "
            f"| {_cell(pr['3c_waf'])} | {_cell(pr['3c_acc'])} | {_cell(pr['swap'])} | {multi} "
            f"| {_cell(ns['two_class']['waf']) if ns else '-'} | {_cell(pr['longer'])} | {_cell(pr['unparseable'])} "
            f"| {_cell(pr['failed'])} |"
        )
    if summaries:
        lb = summaries[0]["evaluation"]["length_baseline"]
        lines.append(
            f"| length baseline (prefer the longer) | - | {lb['two_class']['waf']:.2f} | {lb['two_class']['acc']:.2f} "
            f"| {lb['three_class']['waf']:.2f} | {lb['three_class']['acc']:.2f} | 100.00 | 100.00 | - | 100.00 | 0 "
            "| 0 |"
        )
    return "\n".join(lines) + "\n"


def table_note(runs: int, swap: bool, tie_policy: str, summaries: Sequence[dict]) -> str:
    """The sentence under `table2_markdown`, from what ran: the runs, in both orders or the normal order only
    (``--no-swap``: swap consistency and N+S not measured), and the N+S column's vote as `summarize` recorded it
    (`normal_swapped`: its runs per order and tie break), or why the column is empty."""
    parts = [f"Mean ± std over {runs} run(s)"]
    if swap:
        parts.append("swap consistency per run (run r normal vs run r swapped)")
    else:
        parts.append("normal order only (--no-swap): swap consistency and N+S not measured")
    parts.append(f"two-class ties/invalid counted as `{tie_policy}`")
    ns = next((s["normal_swapped"] for s in summaries if s.get("normal_swapped")), None)
    if ns is not None:
        n, tie_break = ns["n_runs"], ns["tie_break"]
        parts.append(f"N+S = majority over {n} normal + {n} swapped runs, split votes -> {tie_break}")
    elif swap:
        parts.append(f"N+S needs {NS_RUNS} normal + {NS_RUNS} swapped runs, {runs} of each ran: not computed")
    return "; ".join(parts) + "."


def crowd_markdown(crowd: dict) -> str:
    """The top-k crowdsourcing sweep as a Markdown table."""
    lines = [
        f"Kept (WAF and swap consistency >= floor, ranked by WAF): {', '.join(crowd['kept']) or 'none'}",
        *(f"- dropped {name}: {why}" for name, why in crowd["dropped"].items()),
        "",
        "| k | members | 2-class WAF | 2-class ACC | 3-class WAF | 3-class ACC | Swap cons. |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for row in crowd["rows"]:
        swap = f"{row['swap_consistency']:.2f}" if row["swap_consistency"] is not None else "-"
        lines.append(
            f"| {row['k']} | {', '.join(row['members'])} | {row['two_class']['waf']:.2f} | {row['two_class']['acc']:.2f} "
            f"| {row['three_class']['waf']:.2f} | {row['three_class']['acc']:.2f} | {swap} |"
        )
    return "\n".join(lines) + "\n"


def run_zero_shot(
    config: JudgeConfig,
    pairs: Sequence[PreferencePair],
    strategies: Sequence[str] = ("S1",),
    *,
    runs: int = 2,
    swap: bool = True,
    output_dir: str | Path | None = None,
    references: dict[str, str] | None = None,
    media_root: str | Path | None = None,
    ignore_media: bool = False,
    tie_policy: metrics.TiePolicy = "wrong",
    backends: dict[str, Backend] | None = None,
    progress: bool = True,
    crowd_floor: tuple[float, float] = (60.0, 60.0),
    controlled: ControlledSet | tuple[Sequence[Negative], str] | None = None,
    in_sample: tuple[int | None, str] | None = None,
) -> dict:
    """Judge every pair with each strategy (normal + swapped order, `runs` runs) and build the report.

    Args:
        config: the judge definition.
        pairs: labelled pairs.
        strategies: any of `"S1"`...`"S4"`.
        runs: repeated runs R (>= 1; the normal+swapped combination needs 2).
        output_dir: where `calls.jsonl` (the cache), `judgements.jsonl`, `report.json` and `report.md` go;
            None keeps everything in memory.
        references: sample id -> reference description for S2-S4 samples without media.
        backends: `{"mllm": ..., "llm": ...}` to use instead of building them from the config (tests, reuse).
        crowd_floor: (WAF, swap consistency) floors of the crowdsourcing sweep over the strategies run.
        controlled: `(negatives, source)`: each strategy also judges every controlled negative (original vs
            negative, the same orders and runs, its calls counted in `calls`); the report's `controlled_errors`
            holds one section per strategy (`emoreward.evaluation.controlled`; a `ControlledSet` with in-sample
            flags counts them there).
        in_sample: `(n, note)`: how many of `pairs` the judge was trained on (`training.provenance.in_sample_flags`
            of a trained judge's folder; None: unknown) and the report's note when n > 0; the report's
            `n_in_sample_pairs`.

    Returns:
        the report dict (also `report.json`); `markdown` holds the Table-2-style text.

    Raises:
        ValueError: unknown or repeated strategy, runs < 1; `MissingReferenceError` for S2-S4 without media or references.
    """
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown:
        raise ValueError(f"unknown strategies {unknown}; available: {list(STRATEGIES)}")
    repeated = sorted({s for s in strategies if list(strategies).count(s) > 1})
    if repeated:  # a repeat would be a second row of the same numbers, its calls counted again as reused
        raise ValueError(f"--strategy: {repeated} given more than once; give each strategy once")
    if runs < 1:
        raise ValueError(f"runs must be >= 1, got {runs}")
    pairs = list(pairs)
    out_dir = Path(output_dir) if output_dir is not None else None
    cache = CallCache(out_dir / CACHE_FILE if out_dir is not None else None)
    n_cached_before = len(cache)
    prompts = load_prompts(config.prompts)
    backends = dict(backends or {})
    # models load on the first call the cache cannot answer: a finished job reruns without loading any
    if "mllm" not in backends:
        backends["mllm"] = LazyBackend(config.mllm)
    if "llm" not in backends and config.llm is not None and any(s in ("S3", "S4") for s in strategies):
        backends["llm"] = LazyBackend(config.llm)
    no_media = [p.sample_id for p in pairs if ignore_media or _no_media(p, media_root)]
    stats = CallStats()
    bar = None
    if progress:
        from tqdm.auto import tqdm

        orders = 2 if swap else 1
        total = 0
        for s in strategies:
            per = 2 if s == "S4" else 1
            total += runs * (orders * per * len(pairs) + (len(pairs) - len(no_media) if s in READS_REFERENCES else 0))
            total += runs * orders * per * (len(controlled[0]) if controlled else 0)
        bar = tqdm(total=total, desc=f"judge {config.name}", unit="call", dynamic_ncols=True)
    started = time.perf_counter()
    cost = CostLedger("calls")  # the command's calls: each strategy's pairs, then the rest (controlled negatives)
    summaries, results, sections = [], {}, {}
    try:
        for strategy in strategies:
            judge = ZeroShotJudge(
                config.name,
                strategy,  # type: ignore[arg-type]
                mllm=backends["mllm"],
                llm=backends.get("llm"),
                prompts=prompts,
                sampling=config.sampling,
                cache=cache,
                verdict_mode=config.verdict,
                references=references,
                media_root=media_root,
                ignore_media=ignore_media,
                chunk_size=default_chunk_size(backends["mllm"]),
                progress=bar,
                stats=stats,
            )
            judge.register(pairs)
            mark = (stats.made, stats.cached, stats.reused, stats.failed, time.perf_counter())
            result = run_judge(judge, pairs, swap=swap, runs=runs)
            cost.add("pairs", **_calls_since(stats, *mark))
            results[strategy] = result
            if controlled is not None:
                negatives, source, flags, new_edit = ControlledSet(*controlled)
                sections[strategy] = controlled_errors(
                    judge, negatives, source=source, runs=runs, swap=swap, in_sample=flags, new_edit=new_edit
                )
            summary = summarize(result, strategy, tie_policy, media_by_id=bool(media_root))
            if judge.greedy and runs > 1:
                # runs 2..R are run 0's calls again: identical by construction, nothing was measured
                summary["greedy_runs_reused"] = True
                summary["per_run"]["multi_run_consistency"] = None
            summaries.append(summary)
            if out_dir is not None:
                _write_jsonl(out_dir / f"judgements_{strategy}.jsonl", judgement_rows(result))
    finally:
        if bar is not None:
            bar.close()
    done = cost.total()
    rest = _calls_since(stats, *(done.get(k, 0) for k in CALL_COUNTS), started + done.get("seconds", 0))
    cost.add("controlled_negatives" if controlled is not None else "pairs", **rest)  # every call in one part
    elapsed = cost.total()["seconds"]
    y_true = [p.label for p in pairs]
    crowd = None
    members = [crowd_member(f"{config.name}/{s}", r, tie_policy) for s, r in results.items()]
    if swap and len(members) > 1:
        probe = crowdsource(members, y_true, ks=[], min_waf=crowd_floor[0], min_swap_consistency=crowd_floor[1])
        if probe["kept"]:
            crowd = crowdsource(members, y_true, min_waf=crowd_floor[0], min_swap_consistency=crowd_floor[1])
        else:
            crowd = probe
    text_only = sorted(set(no_media))
    notes = []
    if "S1" in strategies and text_only:  # counted in pairs (a sample may have several)
        notes.append(f"S1 ran on the descriptions alone (no media) for {len(no_media)} of {len(pairs)} pairs.")
    if any(s in ("S3", "S4") for s in strategies) and config.llm is None and "llm" not in backends:
        notes.append("No external LLM is defined: the MLLM also performed the S3/S4 text steps.")
    if runs > 1 and not config.sampling.do_sample:
        notes.append(
            f"Greedy decoding (do_sample: false): runs 2-{runs} reuse run 1's calls, so every run gives the same "
            "answers. Multi-run consistency is therefore trivial (100% by construction, not measured) and the std "
            "over runs is 0; sample (do_sample: true) to measure it."
        )
    n_in_sample = in_sample[0] if in_sample is not None else None
    if n_in_sample:
        notes.append(in_sample[1])  # type: ignore[index]
    if stats.failed:
        notes.append(
            f"{stats.failed} call(s) FAILED (no answer: server or model errors, see `error` in judgements_*.jsonl). "
            "They count as INVALID in the metrics but are listed apart from unparseable answers ('Failed calls/run'); "
            "failed calls are not cached: run the same command again to retry them."
        )

    markdown = f"## Zero-shot judge `{config.name}` (prompts {prompts.tag}, verdicts from {config.verdict})\n\n"
    markdown += table2_markdown(config.name, summaries)
    markdown += "\n" + table_note(runs, swap, tie_policy, summaries) + "\n"
    weighting = weighting_note([summaries[0]["evaluation"]], rows=False) if summaries else ""
    if weighting:
        markdown += "\n" + weighting + "\n"
    if notes:
        markdown += "\n" + "\n".join(f"- {n}" for n in notes) + "\n"
    if crowd is not None:
        markdown += "\n### Model-based crowdsourcing over the strategies run\n\n" + crowd_markdown(crowd)
    for strategy, section in sections.items():
        markdown += "\n" + controlled_markdown(section, f"Controlled errors, {config.name}/{strategy}")
    report = {
        "judge": config.name,
        "judge_source": config.source,
        "prompts": {"tag": prompts.tag, "digest": prompts.digest, "source": prompts.source},
        "sampling": config.sampling.as_dict(),
        "verdict_mode": config.verdict,
        "backends": {k: b.identity for k, b in backends.items()},
        "runs": runs,
        "swap": swap,
        "n_pairs": len(pairs),
        "n_in_sample_pairs": n_in_sample,
        "text_only_samples": len(text_only),
        "strategies": {s["strategy"]: s for s in summaries},
        "crowd": crowd,
        **({"controlled_errors": sections} if controlled is not None else {}),
        "notes": notes,
        "calls": {
            "made": stats.made,
            "cached": stats.cached,
            "reused_greedy": stats.reused,
            "failed": stats.failed,
            "cache_corrupt_lines": cache.n_corrupt,
            "in_cache_before": n_cached_before,
            "seconds": elapsed,
            "prefill_s": stats.prefill_s,
            "decode_s": stats.decode_s,
            "models_loaded": {k: getattr(b, "loaded", True) for k, b in backends.items()},
        },
        "cost": cost.record(),  # the calls above by part (`emoreward.evaluation.cost`): the printed line's values
        "markdown": markdown,
    }
    if out_dir is not None:
        atomic_write_json(out_dir / "report.json", report)
        atomic_write_text(out_dir / "report.md", markdown)
    return report


CALL_COUNTS = ("made", "cached", "reused_greedy", "failed")


def _calls_since(stats: CallStats, made: float, cached: float, reused: float, failed: float, since: float) -> dict:
    """The calls `stats` counted, and the seconds that passed, since the given counts and `time.perf_counter` value."""
    now = (stats.made - made, stats.cached - cached, stats.reused - reused, stats.failed - failed)
    return {**dict(zip(CALL_COUNTS, now)), "seconds": time.perf_counter() - since}


def _no_media(pair: PreferencePair, media_root) -> bool:
    from zero_shot.strategies import resolve_media

    return resolve_media(pair, media_root) is None


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    atomic_write_text(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
