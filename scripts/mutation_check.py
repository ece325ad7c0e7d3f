"""Break each relation's owner on purpose and check that its relation test fails (docs/development.md, Relations).

Each mutation is applied to a scratch copy of the committed tree (`git worktree`), never to this checkout; the
relation's test module runs there with ``-x``, after a control run of the same modules on the unchanged tree.
Prints one row per relation; exit status 1 if the control fails or a mutation survives.

    python scripts/mutation_check.py [--only permutation,duplication] [--timeout 900]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutation:
    relation: str
    file: str
    old: str
    new: str
    test: str
    what: str


MUTATIONS = (
    Mutation(
        "permutation",
        "emoreward/data/tables.py",
        "return sorted(models, key=model_key), sorted(samples, key=sample_key)",
        "return list(models), list(samples)",
        "tests/relations/test_permutation.py",
        "canonical_order keeps the rows' order",
    ),
    Mutation(
        "duplication",
        "emoreward/data/pairs.py",
        "        if content not in contents:\n",
        "        if True:\n",
        "tests/relations/test_duplication.py",
        "the pair loader accepts a repeated pair",
    ),
    Mutation(
        "renaming and normal forms",
        "emoreward/data/text.py",
        'return unicodedata.normalize("NFC", text)',
        "return text",
        "tests/relations/test_renaming.py",
        "normal_text returns its input",
    ),
    Mutation(
        "renaming and normal forms",
        "emoreward/data/negatives/records.py",
        "return (*texts, subtitle, self.span_start, self.span_end, self.replacement, video, audio, sample_id)",
        "return (sample_id, video, audio, subtitle, *texts, self.span_start, self.span_end, self.replacement)",
        "tests/relations/test_renaming.py",
        "controlled negatives ordered by sample id (a renamed file trains other batches)",
    ),
    Mutation(
        "subset commutation",
        "emoreward/data/tables.py",
        "        models, samples = canonical_order(keep_m, keep_s, descriptions, media)\n",
        "        models, samples = list(models), list(samples)\n",
        "tests/relations/test_subset.py",
        "DescriptionTable.subset keeps the order the selection names",
    ),
    Mutation(
        "accounting",
        "emoreward/ranking/judging.py",
        "    return JudgeRun(records, made, n_invalid, len(pairs), reused, keyed)",
        "    return JudgeRun(records, asked, n_invalid, len(pairs), reused, keyed)",
        "tests/relations/test_accounting.py",
        "judge calls counted as pairs x orders x runs, not as made",
    ),
    Mutation(
        "separation and degeneracy",
        "emoreward/utils/separation.py",
        "    if yz.shape[0] == 0 or x.shape[1] == 0:\n        return None",
        "    if True:\n        return None",
        "tests/relations/test_separation.py",
        "separating_direction never finds separation",
    ),
    Mutation(
        "content identity",
        "emoreward/training/run_identity.py",
        "backbone = source_identity(config.model_name_or_path)",
        "backbone = config.model_name_or_path",
        "tests/relations/test_content_identity.py",
        "the run identity holds the backbone's path, not its content",
    ),
    Mutation(
        "content identity",
        "emoreward/training/run_identity.py",
        "    unused = set(inapplicable_fields(config))",
        "    unused = set()",
        "tests/relations/test_content_identity.py",
        "the run identity holds recipe fields the recipe's settings rule out (lora_r without LoRA)",
    ),
    Mutation(
        "content identity",
        "emoreward/training/run_identity.py",
        "if k not in NOT_RESULT_FIELDS | by_content | unused}",
        "if k not in by_content | unused}",
        "tests/relations/test_content_identity.py",
        "the run identity holds the fields that change no result (log_level, dataset_text_field)",
    ),
    Mutation(
        "renaming and normal forms",
        "emoreward/training/run_identity.py",
        "sorted((label for _, label in p.annotations), key=str)",
        "[list(a) for a in p.annotations]",
        "tests/relations/test_renaming.py",
        "the run identity digests the annotators' names (renamed annotators refused as other labels)",
    ),
    Mutation(
        "content identity",
        "emoreward/training/pipeline.py",
        "        training_record(**final_training_data(config, pairs)),",
        "        None,",
        "tests/relations/test_content_identity.py",
        "train's eval_file is checked against no training record (its training pairs counted as held out)",
    ),
    Mutation(
        "content identity",
        "emoreward/models/loading.py",
        'base = f"content={content}" if content else str(name_or_path)',
        'base = f"{name_or_path}:content={content}" if content else str(name_or_path)',
        "tests/relations/test_content_identity.py",
        "a judge model's identity holds its path (a copied judge folder makes every call again)",
    ),
    Mutation(
        "output closure",
        "emoreward/utils/io.py",
        "            self._optional[key].unlink(missing_ok=True)",
        "            pass",
        "tests/relations/test_output_closure.py",
        "OutputFiles.finish keeps stale files",
    ),
    Mutation(
        "output closure",
        "emoreward/cli/options.py",
        "    for name, item in inputs:",
        "    for name, item in ():",
        "tests/relations/test_output_closure.py",
        "check_output_dir lets an output folder be, lie inside or contain an input (the model, the data)",
    ),
    Mutation(
        "output closure",
        "emoreward/cli/options.py",
        "    if own is not None and path.is_dir():",
        "    if False:",
        "tests/relations/test_output_closure.py",
        "check_output_dir lets evaluate / judge write into a folder holding other work (a judge recipe's run folder)",
    ),
    Mutation(
        "export fidelity",
        "emoreward/models/media/remote_modeling.py",
        "    last = (attention_mask.long() * index).argmax(-1)",
        "    last = torch.full_like(attention_mask[:, 0], attention_mask.shape[1] - 1, dtype=torch.long)",
        "tests/relations/test_export_fidelity.py",
        "the remote-code class reads the last position, not the last non-pad token",
    ),
    Mutation(
        "export fidelity",
        "emoreward/models/layout.py",
        "    return len(offsets) - _tail_start(offsets, end)",
        "    return 0",
        "tests/relations/test_export_fidelity.py",
        "the decoder export's card recipe cuts a long sequence's end-of-turn token (kept_end_tokens keeps none)",
    ),
    Mutation(
        "numeric health",
        "emoreward/data/pairs.py",
        "    if is_null(value) or (isinstance(value, str) and not value.strip()):\n        return None",
        "    if is_missing(value) or (isinstance(value, str) and not value.strip()):\n        return None",
        "tests/relations/test_numeric_health.py",
        "a NaN margin in a pair file is read as a missing margin (is_missing instead of is_null)",
    ),
    Mutation(
        "numeric health",
        "emoreward/models/text.py",
        "        check_finite_weights(model, str(directory))",
        "        pass",
        "tests/relations/test_numeric_health.py",
        "the text model loader does not check its weights",
    ),
    Mutation(
        "wire fields",
        "emoreward/export/serve/fields.py",
        "            if body.get(field.name) is None and field.required_when is not None:",
        "            if False:",
        "tests/relations/test_wire_fields.py",
        "RequestFields.body does not require a field that a server setting reads",
    ),
    Mutation(
        "numeric health",
        "emoreward/models/base.py",
        "    if not bad.size:\n        return\n",
        "    if True:\n        return\n",
        "tests/relations/test_numeric_health.py",
        "the model's scoring does not check its rewards (check_finite_rewards)",
    ),
)


def run_one(mutation: Mutation | None, timeout: int, tests: list[str]) -> tuple[str, float, str]:
    """Apply `mutation` (None: the control, nothing changed) in a scratch worktree and run `tests`; returns
    (outcome, seconds, the test run's last line)."""
    with tempfile.TemporaryDirectory(prefix="emoreward-mutant-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(tree), "HEAD"], check=True)
        try:
            if mutation is not None:
                path = tree / mutation.file
                text = path.read_text()
                if text.count(mutation.old) != 1:
                    return "not applied (the owner's code changed: update the mutation)", 0.0, ""
                path.write_text(text.replace(mutation.old, mutation.new))
            env = {**os.environ, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
            start = time.perf_counter()
            try:
                done = subprocess.run(
                    [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests],
                    cwd=tree, env=env, capture_output=True, text=True, timeout=timeout,
                )  # fmt: skip
            except subprocess.TimeoutExpired:
                return "timed out", time.perf_counter() - start, ""
            seconds = time.perf_counter() - start
            lines = [x for x in done.stdout.strip().splitlines() if x.strip()]
            last = lines[-1] if lines else done.stderr.strip()[-200:]
            if mutation is None:
                return ("passes" if done.returncode == 0 else f"FAILS (exit {done.returncode})"), seconds, last
            outcome = "killed (test failed)" if done.returncode == 1 else f"SURVIVED (exit {done.returncode})"
            return outcome, seconds, last
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated relations (default: all)")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per mutation (default 900)")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTATIONS if not args.only or m.relation in args.only.split(",")]
    if not chosen:
        parser.error(f"--only {args.only}: no such relation; relations: {', '.join(m.relation for m in MUTATIONS)}")
    print("| relation | mutation | test | outcome | s |\n|---|---|---|---|---:|")
    # the control: the same tests on the unchanged tree pass, so a failure below is the mutation's
    outcome, seconds, last = run_one(None, args.timeout, sorted({m.test for m in chosen}))
    print(f"| (control) | none | every test below | {outcome}: {last} | {seconds:.0f} |")
    if outcome != "passes":
        return 1
    survived = 0
    for mutation in chosen:
        outcome, seconds, last = run_one(mutation, args.timeout, [mutation.test])
        survived += not outcome.startswith("killed")
        print(f"| {mutation.relation} | {mutation.what} | `{mutation.test}` | {outcome}: {last} | {seconds:.0f} |")
        sys.stdout.flush()
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
