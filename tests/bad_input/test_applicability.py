"""Options given where they cannot apply: each command's one applicability table (`APPLIES`: option -> when it
applies, read by `emoreward.cli.options.check_applicable`) has an entry for every option of its parser, and an
option given where its condition does not hold is refused before any work, exit 2, one line naming it (before,
one direction of an option pair was refused and the other ignored with exit 0)."""

from __future__ import annotations

import pytest
from bad_input_helpers import fails, run, write

from emoreward.cli.main import build_parser, command_module
from emoreward.cli.options import ALWAYS


TABLED = (
    "rank",
    "evaluate",
    "judge",
    "export",
    "serve",
    "augment",
)  # train: the recipe classes' FIELD_APPLIES (below)


def parser_dests(command: str) -> set[str]:
    sub = build_parser().commands[command]
    sub._populated()
    return {a.dest for a in sub._actions if a.dest != "help"}


@pytest.mark.parametrize("command", TABLED)
def test_every_option_of_the_parser_has_an_applicability_entry(command):
    table = command_module(command).APPLIES
    assert parser_dests(command) <= set(table), parser_dests(command) - set(table)
    siblings = set().union(*(parser_dests(c) for c in TABLED if command_module(c).APPLIES is table))
    assert set(table) <= siblings, set(table) - siblings  # no entry for an option no parser has


def test_every_condition_of_rank_is_decided(rm_dir, judge_yaml):
    from emoreward.cli.rank import APPLIES, applicability_facts

    args = build_parser().parse_args(["rank", "--judge", str(rm_dir), "--judge", str(judge_yaml), "--data", "x"])
    facts = applicability_facts(args)
    assert {c for c in APPLIES.values() if c != ALWAYS} == set(facts)
    assert all(holds for holds, _ in facts.values() if holds is not None) is not None


def _rank(judge, table, tmp_path, *options):
    return ["rank", "--judge", judge, "--data", table, "--output", tmp_path / "r.json", "--cache-dir",
            tmp_path / "cache", "--quiet", *options]  # fmt: skip


RANK = [
    # (id, judge, options, fragment)
    ("rm-strategy", "rm", ["--strategy", "S2"], "--strategy applies to generative (zero-shot) judges; {rm} is a reward"),
    ("rm-runs", "rm", ["--runs", "2"], "--runs applies to generative (zero-shot) judges"),
    ("rm-no-swap", "rm", ["--no-swap"], "--no-swap applies to generative (zero-shot) judges"),
    ("rm-combine", "rm", ["--combine", "consensus"], "--combine applies to generative (zero-shot) judges"),
    ("zs-tie-threshold", "zs", ["--tie-threshold", "0.1"], "--tie-threshold applies to reward-model judges; {zs} is"),
    ("zs-batch-size", "zs", ["--batch-size", "4"], "--batch-size applies to reward-model judges"),
    ("zs-vllm-url", "zs", ["--vllm-url", "http://127.0.0.1:9"], "--vllm-url applies to reward-model judges"),
    ("bpa-n-boot", "rm", ["--method", "bpa", "--n-boot", "5"], "--n-boot is a --method full option; BPA picks"),
    ("bpa-alpha", "rm", ["--method", "bpa", "--alpha", "0.1"], "--alpha is a --method full option"),
    ("bpa-tie-model", "rm", ["--method", "bpa", "--tie-model", "rao-kupper"], "--tie-model is a --method full option"),
    ("bpa-no-length-control", "rm", ["--method", "bpa", "--no-length-control"], "--no-length-control is a --method full"),
    # given at its default value: still given (it was accepted and ignored, exit 0)
    ("bpa-tie-model-default", "rm", ["--method", "bpa", "--tie-model", "davidson"], "--tie-model is a --method full"),
    ("bpa-n-boot-default", "rm", ["--method", "bpa", "--n-boot=1000"], "--n-boot is a --method full option"),
    ("full-hierarchical", "rm", ["--method", "full", "--hierarchical", "2"], "--method full judges every pair of"),
    # a cache folder with no cache: the option pair refused in this direction too (it was ignored with exit 0)
    ("no-cache-cache-dir", "rm", ["--no-cache"], "--cache-dir applies where a cache is kept; --no-cache keeps none"),
    ("full-budget", "rm", ["--budget", "5"], "--budget is a --method bpa option"),  # the direction refused before
    ("full-exploration", "rm", ["--exploration", "match_quality"], "--exploration is a --method bpa option"),
    # a policy-specific option: random picks uniformly, by no exploration rule (it was recorded in the report)
    ("bpa-random-exploration", "rm", ["--method", "bpa", "--policy", "random", "--exploration", "match_quality"],
     "--exploration is the exploration rule of --policy exploration, paper, bpa; --policy random picks its pairs by "
     "no exploration rule"),
    ("bpa-random-exploration-default", "rm", ["--method", "bpa", "--policy", "random", "--exploration",
     "ranking_variance"], "--exploration is the exploration rule of --policy"),
]  # fmt: skip


@pytest.mark.parametrize("judge, options, fragment", [c[1:] for c in RANK], ids=[c[0] for c in RANK])
def test_rank_refuses_an_option_where_it_cannot_apply(judge, options, fragment, rm_dir, judge_yaml, good_table,
                                                      tmp_path, capsys):  # fmt: skip
    spec = {"rm": rm_dir, "zs": judge_yaml}[judge]
    fails(_rank(spec, good_table, tmp_path, *options), capsys, fragment.format(rm=rm_dir, zs=judge_yaml))
    assert not (tmp_path / "r.json").exists() and not (tmp_path / "cache").exists()  # before any work


EVALUATE = [
    ("batch-size", ["--batch-size", "4"], "--batch-size applies to reward models; {zs} is a zero-shot judge"),
    ("vllm-url", ["--vllm-url", "http://127.0.0.1:9"], "--vllm-url applies to reward models"),
    ("dtype", ["--dtype", "float32"], "--dtype applies to reward models"),  # the direction refused before
]


@pytest.mark.parametrize("options, fragment", [c[1:] for c in EVALUATE], ids=[c[0] for c in EVALUATE])
def test_evaluate_refuses_a_reward_model_option_for_a_zero_shot_judge(options, fragment, judge_yaml, good_pairs,
                                                                     tmp_path, capsys):  # fmt: skip
    argv = ["evaluate", "--model", judge_yaml, "--data", good_pairs, "--output", tmp_path / "r.json", *options]
    fails(argv, capsys, fragment.format(zs=judge_yaml))
    assert not list(tmp_path.iterdir())


def test_judge_refuses_zero_shot_options_for_a_reward_model(rm_dir, good_pairs, tmp_path, capsys):
    argv = ["judge", "--judge", rm_dir, "--data", good_pairs, "--output", tmp_path / "j", "--limit", "2", "--no-swap"]
    fails(argv, capsys, f"{rm_dir} is a reward model; --no-swap, --limit apply to zero-shot judges only")


JUDGE = [
    # (id, judge, options, fragment): the media option pair and the references refused alike (before, --media-root
    # was refused on a text-only judge while --ignore-media, and --references with S1 alone, ran with exit 0)
    ("ignore-media-text-judge", "zs", ["--ignore-media"], "--ignore-media applies to judges that read media files or "
     "data that names them; {zs} reads text only and {data} names no media file"),
    ("references-s1", "zs", ["--strategy", "S1", "--references", "{refs}"], "--references applies to the strategies "
     "that read a reference description (S2, S3, S4); --strategy S1 reads none"),
    ("references-rm", "rm", ["--references", "{refs}"], "{rm} is a reward model; --references applies to zero-shot"),
    ("ignore-media-rm", "rm", ["--ignore-media"], "{rm} is a reward model; --ignore-media applies to zero-shot"),
]  # fmt: skip


@pytest.mark.parametrize("judge, options, fragment", [c[1:] for c in JUDGE], ids=[c[0] for c in JUDGE])
def test_judge_refuses_a_media_or_references_option_where_it_cannot_apply(judge, options, fragment, rm_dir,
                                                                          judge_yaml, good_pairs, tmp_path, capsys):  # fmt: skip
    refs = write(tmp_path / "refs.jsonl", '{"sample_id": "v1", "description": "a calm face"}\n')
    names = {"zs": judge_yaml, "rm": rm_dir, "data": good_pairs, "refs": refs}
    options = [o.format(**names) for o in options]
    argv = ["judge", "--judge", names[judge], "--data", good_pairs, "--output", tmp_path / "j", *options]
    fails(argv, capsys, fragment.format(**names))
    assert not (tmp_path / "j").exists()  # before any work


def test_ignore_media_applies_to_a_text_judge_whose_data_names_media(judge_yaml, tmp_path, capsys):
    """The other side: a text-only judge refuses data that names media files unless told to ignore them."""
    clip = write(tmp_path / "v1.mp4", b"")
    data = write(tmp_path / "pairs.csv", f"name,a1,a2,preference,video\nv1,She smiles.,Neutral.,a1,{clip}\n")
    argv = ["judge", "--judge", judge_yaml, "--data", data, "--output", tmp_path / "j", "--runs", "1", "--no-progress"]
    code, _, err = run(argv, capsys)
    assert code == 2 and "reads only text but the sample has ['video']" in err and "--ignore-media" in err, err
    code, _, err = run([*argv, "--ignore-media"], capsys)
    assert code == 0, err


def test_export_refuses_public_without_an_upload(rm_dir, tmp_path, capsys):
    fails(["export", "--model", rm_dir, "--output", tmp_path / "e", "--public"], capsys,
          "--public applies to the upload (--push-to-hub)")  # fmt: skip
    assert not list(tmp_path.iterdir())


SERVE = [
    ("ray-option-single", ["--replicas", "2"], "--replicas applies to --engine ray (Ray Serve replicas)"),
    ("ray-options-single", ["--num-cpus", "2", "--ray-address", "auto"], "--ray-address, --num-cpus apply to --engine"),
    ("no-model-process-ray", ["--engine", "ray", "--no-model-process"], "--model-process is for --engine single"),
    ("model-process-ray", ["--engine", "ray", "--model-process"], "--model-process is for --engine single"),
]  # fmt: skip


@pytest.mark.parametrize("options, fragment", [c[1:] for c in SERVE], ids=[c[0] for c in SERVE])
def test_serve_refuses_an_engine_option_for_the_other_engine(options, fragment, rm_dir, capsys):
    fails(["serve", "--model", rm_dir, "--port", "0", *options], capsys, fragment)


def test_serve_refuses_text_model_options_for_a_multimodal_model(vl_dir, capsys):
    fails(["serve", "--model", vl_dir, "--port", "0", "--allow-unused-media"], capsys,
          f"--allow-unused-media applies to text models; {vl_dir} is a multimodal model")  # fmt: skip


def test_an_option_where_it_applies_is_accepted(judge_yaml, good_table, tmp_path, capsys):
    """The other side of each pair: a generative judge takes --runs and --no-swap, the full method --n-boot."""
    code, _, err = run(_rank(judge_yaml, good_table, tmp_path, "--runs", "2", "--no-swap", "--n-boot", "5"), capsys)
    assert code == 0, err


# ------------------------------------------------------------------------------------------- train: recipe fields
# the recipe classes' tables (`FIELD_APPLIES`: applicability.REWARD_FIELDS, JUDGE_FIELDS; one check: check_fields_apply)
TRAIN = [
    # (id, recipe lines, options, fragments)
    ("lora-without-peft", "", ["--no_use_peft", "--lora_r", "4", "--lora_target_modules", "query", "value"],
     ["--lora_r 4: lora_r=4, lora_target_modules=['query', 'value'] do not apply with use_peft=False",
      "there are no LoRA adapters"]),
    ("tie-parameter-with-drop", "", ["--ties", "drop", "--tie_parameter", "3"],
     ["tie_parameter=3.0 does not apply with ties='drop' (--ties drop)"]),
    ("tie-parameter-default-drop", "", ["--set", "tie_parameter=3"],
     ["--set tie_parameter=3: tie_parameter=3.0 does not apply with ties='drop'"]),
    ("negatives-file-without-kinds", "", ["--controlled_negatives_file", "n.jsonl"],
     ["controlled_negatives_file='n.jsonl' does not apply with controlled_negatives=None"]),
    ("odin-without-two-heads", "", ["--length_debias", "reweight", "--odin_orthogonal_weight", "0.5"],
     ["odin_orthogonal_weight=0.5 does not apply with length_debias='reweight'"]),
    ("tie-policy-without-evaluation", "", ["--cv_folds", "0", "--two_class_tie_policy", "first"],
     ["two_class_tie_policy='first' does not apply with cv_folds=0 (--cv_folds 0), eval_file=None: no fold"]),
    ("fit-workers-without-folds", "", ["--cv_folds", "0", "--fit_workers", "2"],
     ["fit_workers=2 does not apply with cv_folds=0 (--cv_folds 0): there are no cross-validation folds"]),
    ("recipe-fit-workers-without-folds", "cv_folds: 1\nfit_workers: 2\n", [],
     ["recipe.yaml, line 2: fit_workers=2 does not apply with cv_folds=1 (", "recipe.yaml, line 1)"]),
    ("wandb-project-without-wandb", "", ["--no-wandb", "--wandb_project", "p"],
     ["wandb_project='p' does not apply with report_to=[] (--report_to ['none']): nothing is logged to W&B"]),
    ("recipe-tie-parameter", "ties: drop\ntie_parameter: 3\n", [],
     ["recipe.yaml, line 2: tie_parameter=3.0 does not apply with ties='drop' (", "recipe.yaml, line 1)"]),
    ("judge-lora-without-peft", "recipe: judge\nbf16: false\n", ["--no_use_peft", "--set", "lora_alpha=8"],
     ["--set lora_alpha=8: lora_alpha=8 does not apply with use_peft=False"]),
    ("judge-dpo-without-epochs", "recipe: judge\nbf16: false\n", ["--set", "dpo_beta=0.3"],
     ["dpo_beta=0.3 does not apply with dpo_epochs=0.0: the judge trains by SFT alone"]),
    ("judge-media-without-family", "recipe: judge\nbf16: false\n", ["--set", "max_frames=4"],
     ["max_frames=4 does not apply with family=None: a text chat LM judge reads no video or audio"]),
    # fields the pipeline overrides: a run folder resumes by its run identity; a judge's stages save no checkpoint
    ("resume-from-checkpoint", "", ["--resume_from_checkpoint", "/nonexistent/checkpoint-7"],
     ["resume_from_checkpoint='/nonexistent/checkpoint-7' does not apply to this recipe: the run resumes by its own "
      "run identity", "leave it out"]),
    ("judge-resume-from-checkpoint", "recipe: judge\nbf16: false\n", ["--resume_from_checkpoint", "ck-3"],
     ["resume_from_checkpoint='ck-3' does not apply to this recipe: the run resumes by its own run identity"]),
    ("judge-save-strategy", "recipe: judge\nbf16: false\n", ["--save_strategy", "epoch", "--save_steps", "1"],
     ["save_strategy='epoch', save_steps=1.0 do not apply to this recipe: a judge's SFT and DPO stages save no step "
      "checkpoint"]),
    ("recipe-judge-save-steps", "recipe: judge\nbf16: false\nsave_steps: 3\n", [],
     ["save_steps=3 does not apply to this recipe"]),
    # the Hub fields without a push, as wandb_project without wandb
    ("hub-model-id-without-push", "", ["--hub_model_id", "me/x"],
     ["hub_model_id='me/x' does not apply with push_to_hub=False: nothing is pushed to the Hub"]),
    ("hub-strategy-without-push", "", ["--hub_strategy", "checkpoint"],
     ["hub_strategy='checkpoint' does not apply with push_to_hub=False"]),
    ("judge-hub-private-without-push", "recipe: judge\nbf16: false\n", ["--set", "hub_private_repo=true"],
     ["hub_private_repo=True does not apply with push_to_hub=False"]),
    # a judge is evaluated on its held-out folds after training and learns on its backbone's own chat template
    ("judge-eval-steps", "recipe: judge\nbf16: false\n", ["--eval_steps", "7"],
     ["eval_steps=7.0 does not apply to this recipe: a judge is evaluated on its held-out folds"]),
    ("judge-eval-strategy", "recipe: judge\nbf16: false\n", ["--eval_strategy", "steps"],
     ["eval_strategy='steps' does not apply to this recipe"]),
    ("judge-chat-template-path", "recipe: judge\nbf16: false\n", ["--chat_template_path", "t"],
     ["chat_template_path='t' does not apply to this recipe: a judge learns on the text it is scored on"]),
    # numbers every recipe kind refuses: non-finite, or nothing to train
    ("judge-nan-dropout", "recipe: judge\nbf16: false\n", ["--lora_dropout", "nan"],
     ["lora_dropout=nan: expected a finite number"]),
    ("judge-inf-epochs", "recipe: judge\nbf16: false\n", ["--num_train_epochs", "inf"],
     ["num_train_epochs=inf: expected a finite number"]),
    ("nan-max-grad-norm", "", ["--max_grad_norm", "nan"], ["max_grad_norm=nan: expected a finite number"]),
    ("judge-trains-nothing", "recipe: judge\nbf16: false\n", ["--cv_folds", "0", "--final_fit", "false"],
     ["cv_folds=0 and final_fit=false: the recipe trains nothing"]),
    ("judge-zero-epochs", "recipe: judge\nbf16: false\n", ["--num_train_epochs", "0"],
     ["num_train_epochs=0.0 (with max_steps=-1) trains zero steps"]),
]  # fmt: skip


@pytest.mark.parametrize("lines, options, fragments", [c[1:] for c in TRAIN], ids=[c[0] for c in TRAIN])
def test_train_refuses_a_recipe_field_where_it_cannot_apply(lines, options, fragments, tmp_path, capsys):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(lines + "report_to: [none]\nmodel_name_or_path: minilm\n")
    fails(["train", "--config", recipe, "--output_dir", tmp_path / "out", *options], capsys, *fragments)
    assert not (tmp_path / "out").exists()  # before any work


def test_a_recipe_value_the_command_line_switches_off_is_kept_unused(tmp_path):
    """A field counts as given where it is not below the setting that rules it out: the recipe's tie parameter of a
    likelihood that `--ties drop` switches off, the recipe's LoRA rank under `--no_use_peft` or a recipe line that
    repeats a default are accepted (and left out of the run identity: tests/relations/test_content_identity.py)."""
    from emoreward.training.applicability import inapplicable_fields
    from emoreward.training.config import RecipeParser

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("ties: davidson\ntie_parameter: 2\nlora_r: 4\nreport_to: [none]\n")
    (config,) = RecipeParser(prog="train").parse_args_and_config(["--config", str(recipe), "--ties", "drop",
                                                                   "--no_use_peft"])  # fmt: skip
    assert (config.ties, config.tie_parameter, config.use_peft, config.lora_r) == ("drop", 2.0, False, 4)
    assert set(inapplicable_fields(config)) == {"tie_parameter", "lora_r", "lora_alpha", "lora_dropout",
                                                "lora_target_modules", "controlled_negatives_file",
                                                "odin_length_weight", "odin_orthogonal_weight", "wandb_project",
                                                "wandb_log_model", "resume_from_checkpoint", "hub_model_id",
                                                "hub_strategy", "hub_token", "hub_private_repo", "hub_always_push",
                                                "hub_revision"}  # fmt: skip
    assert "two_class_tie_policy" not in inapplicable_fields(config)  # cv_folds 5: evaluated
    recipe.write_text("ties: drop\ntie_parameter: 1.0\nuse_peft: false\nlora_r: 16\nreport_to: [none]\n")
    assert RecipeParser(prog="train").parse_args_and_config(["--config", str(recipe)])[0].use_peft is False


def test_every_condition_of_the_recipe_tables_is_decided():
    """Each recipe class's table names its own fields, and each of its conditions is decided by fields of the class."""
    from dataclasses import fields

    from emoreward.training.config import EmoRewardConfig
    from emoreward.training.judge_config import JudgeTrainConfig

    for config in (
        EmoRewardConfig(output_dir="o", report_to=[]),
        JudgeTrainConfig(output_dir="o", report_to=[], bf16=False),
    ):
        names = {f.name for f in fields(config)}
        table = type(config).FIELD_APPLIES
        conditions = table.conditions(config)
        assert set(table.fields) <= names
        assert set(table.fields.values()) == set(conditions)
        assert all(set(c.settings) <= names for c in conditions.values())
