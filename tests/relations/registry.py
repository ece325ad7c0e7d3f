"""The relation registry: for every command of `emoreward.cli.main.COMMANDS` and every RL / library route, every
option -> the relations that concern it (tuple of names of `RELATIONS`), or a short reason why none does (str).

Commands and their options are read from the real parser (`emoreward.cli.main.build_parser()`), routes and theirs
from the signature of the callable their framework calls (`ROUTES`). `train`'s options (the fields of both recipe
kinds) are grouped by the rule the code owns (`option_key`): the recipe fields that change a run's result and those
that do not (`emoreward.training.run_identity.NOT_RESULT_FIELDS`); an option named here explicitly takes precedence
over its group. `"*"` is the command or route as a whole (its input read through every option at its default).

A new command, route or option must be registered here with the relations that concern it, and each relation's
module (`RELATIONS[name]`) must exercise it: its module-level ``COVERS: dict[str, tuple[str, ...]]`` lists the
registry keys (option strings as the CLI spells them, a ``@group``, or ``"*"``) its tests run.
`test_registry.py` holds the three of them (parser, registry, COVERS) together.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import inspect


# relation -> its test module in this folder
RELATIONS: dict[str, str] = {
    "permutation": "test_permutation",  # shuffled rows, models, samples: the same numbers
    "duplication": "test_duplication",  # repeated rows: refused, or removed with a warning naming them
    "renaming": "test_renaming",  # renamed models / samples / paths, Unicode forms, message shapes: same numbers
    "subset": "test_subset",  # every subset option equals running on the filtered input
    "accounting": "test_accounting",  # every count a report prints equals the work done
    "separation": "test_separation",  # every fit: a finite, flagged estimate or an explicit undefined
    "content_identity": "test_content_identity",
    "output_closure": "test_output_closure",
    "numeric_health": "test_numeric_health",
    "export_fidelity": "test_export_fidelity",
    "wire_fields": "test_wire_fields",  # request fields declared per route and setting; fixed reply keys at 0, 1, n
}

# route -> "module:qualname" of the callables its framework calls (their parameters are the route's options), or
# () where the route is a wire protocol whose fields the command `serve` parses (its options are `serve`'s)
ROUTES: dict[str, tuple[str, ...]] = {
    "score": ("emoreward.models.base:RewardModel.score",),  # load_reward_model(...).score
    "grpo": ("emoreward.export.grpo:EmotionReward.__init__", "emoreward.export.grpo:EmotionReward.__call__"),
    "verl": ("emoreward.export.verl:compute_score",),
    "pairwise_grpo": (
        "emoreward.export.pairwise:PairwiseGroupReward.__init__",
        "emoreward.export.pairwise:PairwiseGroupReward.__call__",
    ),
    "openrlhf_http": (),  # POST /get_reward of `emoreward serve`
    "openrlhf_reward_func": ("emoreward.export.serve.reward_func:reward_func",),
    "ray": (),  # `emoreward serve --engine ray`: the same service in Ray Serve replicas
}

RESULT_FIELDS = "@result-fields"  # recipe fields that change what a run computes (not NOT_RESULT_FIELDS)
NOT_RESULT_FIELDS = "@not-result-fields"  # fields that change no result (run_identity.NOT_RESULT_FIELDS)

NO_RESULT = "changes where output goes or what is logged, not a number"
LIMIT = "a server limit or resource setting: refusals are tested in tests/export and tests/bad_input"
OUTPUT = "an output file: output_closure"


@functools.cache
def parser_options(command: str) -> dict[str, argparse.Action]:
    """Option string (the first the parser lists: ``--sample-ids``) -> its action, read from the real parser."""
    from emoreward.cli.main import build_parser

    sub = build_parser().commands[command]
    sub._populated()
    out = {}
    for action in sub._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        out[action.option_strings[0] if action.option_strings else action.dest] = action
    return out


@functools.cache
def route_options(route: str) -> tuple[str, ...]:
    """The parameters of the callables of ``route`` (`ROUTES`), without ``self``, ``*args`` and ``**kwargs``."""
    names: list[str] = []
    for target in ROUTES[route]:
        module, qualname = target.split(":")
        obj = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        for p in inspect.signature(obj).parameters.values():
            if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name not in names:
                names.append(p.name)
    return tuple(names)


def options_of(name: str) -> tuple[str, ...]:
    """Every option of a command or route (``"*"`` first)."""
    if name in ROUTES:
        return ("*", *route_options(name))
    return ("*", *parser_options(name))


def train_group(option: str) -> str | None:
    """The group of a `train` option by the rule the code owns: recipe fields that change the result or not, of a
    reward-model recipe or a judge recipe (`train` lists both kinds' fields; `emoreward.cli.train.recipe_class`)."""
    from emoreward.training.config import recipe_fields
    from emoreward.training.judge_config import JudgeTrainConfig
    from emoreward.training.run_identity import NOT_RESULT_FIELDS as NOT_RESULT

    dest = parser_options("train")[option].dest
    if dest in NOT_RESULT:
        return NOT_RESULT_FIELDS
    if dest in recipe_fields() or dest in recipe_fields(JudgeTrainConfig):
        return RESULT_FIELDS
    return None


def option_key(name: str, option: str) -> str | None:
    """The registry key of an option: the option itself when registered, else its group (`train`), else None."""
    entries = REGISTRY.get(name, {})
    if option in entries:
        return option
    if name == "train" and option != "*":
        group = train_group(option)
        if group in entries:
            return group
    return None


# command or route -> registry key (option, @group or "*") -> relations, or the reason none applies.
# Each engineer keeps the rows of the relations they own; wp-ident, wp-export: edit yours as your modules grow.
REGISTRY: dict[str, dict[str, tuple[str, ...] | str]] = {
    "train": {
        "*": ("permutation", "duplication", "accounting", "content_identity", "numeric_health"),
        "--train_file": ("permutation", "duplication", "renaming", "accounting", "numeric_health"),
        # read by the same loader as --train_file (load_pairs); its in-sample check is evaluate's (check_in_sample)
        "--eval_file": ("content_identity",),
        "--cv_folds": ("duplication", "accounting"),
        RESULT_FIELDS: ("content_identity",),
        NOT_RESULT_FIELDS: ("content_identity",),  # a rerun differing in them resumes the same run
        "--output_dir": ("output_closure",),  # one writer per output folder
        "--config": "the recipe file: its fields are the options of the groups above (resolve_config)",
        "--set": "the same as --FIELD VALUE (resolve_config)",
        "--no-wandb": NO_RESULT,
        "--quiet": NO_RESULT,
    },
    "evaluate": {
        "*": ("permutation", "duplication", "renaming", "accounting", "separation"),
        "--model": ("content_identity", "numeric_health"),
        "--data": ("permutation", "duplication", "renaming"),
        "--output": ("output_closure",),
        "--two-class-ties": "a choice of metric definition (tests/test_metrics.py checks its values)",
        "--batch-size": "batching only: tests/test_scoring_engine.py checks scores do not depend on it",
        "--dtype": "precision: tests marked precision compare dtypes (reward_tolerance)",
        "--vllm-url": "scores through a vLLM server serving the export: tests/export/test_vllm.py (make test-vllm) checks the same numbers as in process",
        "--engine-timeout": "how long a served engine may take: tests/relations/test_numeric_health.py (a hung engine)",
        "--media-root": "where media files are: tests/test_data_context.py, tests/bad_input/test_bad_media.py",
        "--controlled-negatives": ("permutation",),
        "--no-controlled-negatives": "switches the controlled-error section off: tests/test_controlled_errors.py",
    },
    "judge": {
        "*": ("permutation", "duplication", "accounting", "separation"),
        "--judge": ("content_identity", "numeric_health"),  # a reward-model folder: its rewards checked as evaluate's
        "--strategy": "a judge setting: each strategy is tested in tests/zero_shot",
        "--data": ("permutation", "duplication"),
        "--output": ("output_closure",),
        "--runs": ("accounting",),
        "--no-swap": ("accounting",),
        "--references": "the S2-S4 reference descriptions (zero_shot.strategies.READS_REFERENCES): "
        "tests/zero_shot/test_config_cli.py; refused with S1 alone or a reward model: tests/bad_input/test_applicability.py",
        "--media-root": "where media files are: tests/bad_input/test_bad_media.py",
        "--ignore-media": "a judge setting: tests/zero_shot/test_multimodal.py; refused where there is no media to "
        "ignore (a text-only judge, data naming none; judges.reads_media): tests/bad_input/test_applicability.py",
        "--limit": ("subset",),
        "--two-class-ties": "a choice of metric definition (tests/test_metrics.py checks its values)",
        "--no-progress": NO_RESULT,
        "--dataset": ("output_closure",),
        "--push-to-hub": "an upload after every local output: tests/bad_input/test_bad_push.py",
        "--list": "lists the bundled judges; computes nothing",
        "--trust-remote-code": "a loading permission (the one remote-code rule): tests/zero_shot/test_config_cli.py",
        "--controlled-negatives": "read by the one reader evaluate uses (read_negatives, content order): the "
        "permutation of evaluate's --controlled-negatives holds; tests/test_controlled_errors.py",
        "--no-controlled-negatives": "switches the controlled-error section off: tests/test_controlled_errors.py",
    },
    "augment": {
        "*": ("permutation",),
        "--data": ("permutation",),
        "--output": ("output_closure",),
        "--source": "which descriptions are edited: tests/test_augment.py checks the counts of each source",
        "--kinds": "which kinds are written: tests/test_augment.py",
        "--engine": "the editing engine: tests/test_augment.py runs both (llm on SmolLM2-135M)",
        "--media-root": "the sample id as a pair's clip, as evaluate --media-root reads the same file (one identity "
        "for pairs and negatives): tests/test_augment.py",
        "--editor": "the LLM editor's judge definition: tests/test_augment.py",
        "--limit": "how many planned LLM edits run, the first N by their pairs' content order (as judge --limit): "
        "tests/test_augment.py counts them and asks the same edits of a shuffled, renamed file",
    },
    "rank": {
        "*": ("permutation", "duplication", "renaming", "accounting", "separation"),
        "--judge": ("content_identity", "numeric_health", "permutation", "renaming"),  # more than once: a committee
        "--data": ("permutation", "duplication", "renaming"),
        "--output": ("output_closure",),
        "--dataset": ("output_closure",),
        "--push-to-hub": "an upload after every local output: tests/bad_input/test_bad_push.py",
        "--quiet": NO_RESULT,
        "--method": ("permutation", "renaming"),
        "--samples": ("subset", "permutation"),
        "--sample-ids": ("subset", "duplication"),
        "--models": ("subset", "duplication"),
        "--hierarchical": ("permutation", "accounting"),
        "--tie-model": ("permutation", "separation"),
        "--no-length-control": "turns the length-controlled fit off: the separation tests run it on",
        "--n-boot": "the number of resamples: tests/ranking/test_batched_bootstrap.py",
        "--alpha": "the interval level: tests/ranking/test_ties_and_intervals.py",
        "--seed": "the resampling seed: same seed, same numbers (tests/ranking/test_rank_cli.py)",
        "--budget": ("accounting",),
        "--sigma-tau": "a BPA prior: tests/ranking/test_bpa_model.py",
        "--refit-every": "a BPA schedule setting: tests/ranking/test_bpa_scheduler.py",
        "--policy": ("accounting",),
        "--exploration": ("accounting",),  # the rule the report names is the one that picked pairs (or null)
        "--tie-threshold": "the tie rule of a reward-model judge: tests/ranking/test_ties_and_intervals.py",
        "--batch-size": "batching only: tests/test_scoring_engine.py checks scores do not depend on it",
        "--media-root": "where media files are: tests/bad_input/test_bad_media.py",
        "--cache-dir": ("content_identity", "renaming", "subset"),  # a call found by its content, not its names
        "--no-cache": ("content_identity",),
        "--strategy": "a judge setting: each strategy is tested in tests/zero_shot",
        "--runs": ("accounting",),
        "--no-swap": ("accounting",),
        "--combine": "how runs of a generative judge combine: tests/ranking/test_rank.py",
        "--vllm-url": ("numeric_health",),  # the same numbers as in process: tests/export/test_vllm.py
        "--engine-timeout": "how long a served engine may take: tests/relations/test_numeric_health.py (a hung engine)",
        "--committee-calibration": ("permutation", "accounting"),
        "--committee-weighting": "the member weight rule (weights_from_agreement): tests/ranking/test_committee_cli.py "
        "checks the weights on counted agreements",
    },
    "serve": {
        "*": ("renaming", "wire_fields"),
        "--model": ("content_identity", "numeric_health"),
        "--host": NO_RESULT,
        "--port": NO_RESULT,
        "--token-env": "authentication: tests/export/serve",
        "--insecure-no-auth": "authentication: tests/export/serve; refused with a token set or on loopback: "
        "tests/bad_input/test_bad_serve.py",
        "--batch-size": "batching only: tests/test_routes_agree.py checks rewards do not depend on it",
        "--forward-tokens": LIMIT,
        "--max-batch-tokens": LIMIT,
        "--max-call-seconds": LIMIT,
        "--max-queue": LIMIT,
        "--queue-timeout": LIMIT,
        "--max-connections": LIMIT,
        "--keepalive-timeout": LIMIT,
        "--read-timeout": LIMIT,
        "--drain-timeout": "the shutdown's drain time: tests/export/test_serve_queue.py (SIGTERM with requests in flight)",
        "--max-body-bytes": LIMIT,
        "--max-items": LIMIT,
        "--max-chars": LIMIT,
        "--overlong": LIMIT,
        "--openrlhf-labels": ("wire_fields",),  # clip labels: tests/export/test_server_media.py (one clip, one
        # reading); refused for a text model: tests/bad_input/test_bad_serve.py
        "--query-marker": "where OpenRLHF's response starts: tests/export/serve",
        "--length-window": "the length monitor: tests/export/test_length_monitor*",
        "--length-threshold": "the length monitor: tests/export/test_length_monitor*",
        "--allow-unused-media": "media of a text model: tests/bad_input/test_bad_serve.py",
        "--media-root": "where media files are: tests/bad_input/test_bad_media.py",
        "--threads": LIMIT,
        "--log-every": NO_RESULT,
        "--model-process": "the model in its own process or not: tests/test_routes_agree.py",
        "--engine": "the server engine: the ray route (tests marked ray)",
        "--replicas": LIMIT,
        "--min-replicas": LIMIT,
        "--max-replicas": LIMIT,
        "--target-ongoing-requests": LIMIT,
        "--ray-address": LIMIT,
        "--num-cpus": LIMIT,
        "--num-gpus": LIMIT,
    },
    "export": {
        "*": ("export_fidelity",),
        "--model": ("export_fidelity", "numeric_health"),
        "--output": ("export_fidelity", "output_closure"),
        "--atol": ("export_fidelity",),
        "--push-to-hub": "an upload after every local output: tests/bad_input/test_bad_push.py",
        "--public": "the visibility of the upload",
    },
    "score": {
        "*": ("renaming", "permutation", "numeric_health", "export_fidelity"),
        "descriptions": ("renaming", "permutation"),
        "contexts": ("renaming",),
        "batch_size": "batching only: tests/test_scoring_engine.py checks scores do not depend on it",
    },
    "grpo": {
        "*": ("renaming",),
        "model": ("content_identity", "numeric_health"),
        "media_root": "where media files are: tests/export",
        "subtitle_column": "a column name of the GRPO dataset: tests/export",
        "video_column": "a column name of the GRPO dataset: tests/export",
        "audio_column": "a column name of the GRPO dataset: tests/export",
        "sample_column": "a column name of the GRPO dataset: tests/export",
        "on_unused_media": "media of a text model: tests/export",
        "batch_size": "batching only: tests/test_routes_agree.py",
        "scale": "a constant factor on every reward: tests/export",
        "name": "the name TRL logs the reward under",
        "length_monitor": "the length monitor: tests/export/test_length_monitor*",
        "vllm_url": "scores through a vLLM server serving the export: tests/export/test_vllm.py (make test-vllm)",
        "prompts": ("renaming",),
        "completions": ("renaming",),
    },
    "verl": {
        "*": ("renaming", "numeric_health", "wire_fields"),
        "data_source": "unused: every sample is scored by the reward model",
        "solution_str": ("renaming",),
        "ground_truth": "the subtitle key of the context: tests/export",
        "extra_info": "the context of the sample: tests/test_data_context.py",
    },
    "pairwise_grpo": {
        "*": ("permutation",),
        "prompts": ("permutation",),
        "completions": ("permutation",),
        "judge": ("numeric_health",),  # any Judge (tests/export/test_pairwise.py); a reward model's rewards checked
        "opponents": "the judge budget: tests/export/test_pairwise.py (opponents met, calls counted)",
        "subtitle_column": "a column name of the GRPO dataset: tests/export/test_pairwise.py",
        "video_column": "a column name of the GRPO dataset: tests/export/test_pairwise.py",
        "audio_column": "a column name of the GRPO dataset: tests/export/test_pairwise.py",
        "sample_column": "a column name of the GRPO dataset: tests/export/test_pairwise.py (two samples, two groups)",
        "name": "the name TRL logs the reward under",
        "length_monitor": "the length monitor: tests/export/test_length_monitor*",
    },
    "openrlhf_http": {"*": ("renaming", "wire_fields", "numeric_health")},
    "openrlhf_reward_func": {
        "*": ("renaming", "wire_fields", "numeric_health"),
        "queries": ("renaming",),
        "prompts": "the prompt removed from the query: tests/export",
        "labels": ("wire_fields",),
    },
    "ray": {"*": "the same RewardService as openrlhf_http in Ray Serve replicas: the tests marked ray"},
}


def relations_of(name: str, option: str) -> tuple[str, ...]:
    """The relations registered for an option (empty where a reason is registered instead)."""
    entry = REGISTRY[name][option_key(name, option)]
    return () if isinstance(entry, str) else entry


__all__ = ["REGISTRY", "RELATIONS", "ROUTES", "option_key", "options_of", "parser_options", "relations_of"]
