"""Renaming and normal forms: renamed models, samples and paths, the other Unicode normal form of every text, and
the equivalent shapes of a chat message give the same numbers. Applied to `rank` (both methods), `evaluate` and
`train` (their data files), and the RL routes' reading of a completion: `score`, `grpo`, `verl`, the OpenRLHF
server route and its Python reward function.

Owners: `emoreward.data.text.normal_text` (the one Unicode form: lengths, the token layout of every model, the
zero-shot prompts), `emoreward.data.context.message_text` (the text of a message, string or content parts),
`emoreward.data.tables.canonical_order` (models by name, samples by content), `emoreward.training.run_identity`
`_labels` (a training run's labels by what training reads from them, never the annotators' names).
"""

from __future__ import annotations

import random
import unicodedata

import pytest
from _helpers import assert_same_rewards
from _inputs import (
    annotated_pair_rows,
    assert_same_numbers,
    n_boot,
    pair_rows,
    read_json,
    run_cli,
    run_ok,
    shuffled,
    table_rows,
    train_recipe,
    write_jsonl,
)

from emoreward.data.text import identity_text


COVERS = {
    "rank": ("*", "--data", "--method", "--judge", "--cache-dir"),
    "evaluate": ("*", "--data"),
    "train": ("--train_file",),
    "serve": ("*",),
    "score": ("*", "descriptions", "contexts"),
    "grpo": ("*", "prompts", "completions"),
    "verl": ("*", "solution_str"),
    "openrlhf_http": ("*",),
    "openrlhf_reward_func": ("*", "queries"),
}

# accented text: NFC and NFD differ in code points (and in characters, the unit of every length)
ACCENTED = ["café crème", "naïve élan", "déjà vu", "señora", "über", "façade", "rôle"]


def nfd(text: str) -> str:
    return unicodedata.normalize("NFD", text)


def accented_rows(n_samples: int = 6) -> list[dict]:
    """A table whose descriptions carry accented words (composed form)."""
    rows = table_rows(n_samples=n_samples)
    for k, row in enumerate(rows):
        row["description"] = f"{row['description']} {ACCENTED[k % len(ACCENTED)]}"
    return rows


RENAMES = {
    "models": lambda row, m: {**row, "model": m.get(row["model"], row["model"])},
    "samples": lambda row, m: {**row, "sample": m.get(row["sample"], row["sample"])},
    "nfd": lambda row, m: {**row, "description": nfd(row["description"])},
}
MODEL_NAMES = {"alpha": "zeta", "beta": "Ærø", "gamma": "a-model", "delta": "m 4"}
SAMPLE_NAMES = {f"s{k}": f"clip-{9 - k:02d}" for k in range(10)}


def rank(capsys, judge, rows, folder, extra=()):
    table = write_jsonl(folder / "some other name.jsonl", rows)
    out = folder / "r.json"
    run_ok(capsys, ["rank", "--judge", judge, "--data", table, "--output", out, *n_boot(30, extra), "--no-cache", "--quiet",
                    *extra])  # fmt: skip
    return read_json(out)


@pytest.mark.parametrize("method", ["full", "bpa"])
@pytest.mark.parametrize("kind", list(RENAMES))
def test_rank_is_invariant_to_names_and_unicode_forms(kind, method, length_judge_yaml, rm_dir, tmp_path, capsys):
    rows = accented_rows()
    mapping = {"models": MODEL_NAMES, "samples": SAMPLE_NAMES, "nfd": {}}[kind]
    renamed = [RENAMES[kind](r, mapping) for r in rows]
    extra = ["--method", "bpa", "--budget", "30"] if method == "bpa" else []
    for judge in (length_judge_yaml, rm_dir):
        (tmp_path / "a").mkdir(exist_ok=True)
        (tmp_path / "b").mkdir(exist_ok=True)
        a = rank(capsys, judge, rows, tmp_path / "a", extra)
        b = rank(capsys, judge, renamed, tmp_path / "b", extra)
        # warnings are prose that name models: compared by count, the numbers by value
        assert len(a["warnings"]) == len(b["warnings"])
        assert_same_numbers(a, b, rename=mapping if kind == "models" else {}, ignore=(r"/warnings/", r"/history/"))


SAMPLING_JUDGE_YAML = (  # a seeded sampling judge: half its verdicts come from each call's seed (zero_shot.testing)
    "name: samplingjudge\nmllm:\n  backend: scripted\n  model: sampled\nsampling: {do_sample: true, seed: 0}\n"
)


@pytest.mark.parametrize("kind", ["models", "samples"])
def test_a_sampling_judge_draws_from_content_not_names(kind, tmp_path, capsys):
    """A sampling zero-shot judge's seeds come from what each call reads (`zero_shot.strategies` `_content_seed`),
    never from a sample's or a model's name: renamed samples or models give the same sampled verdicts, so the same
    ranking numbers; a changed base seed gives others (the seed does decide)."""
    judge = tmp_path / "sampling.yaml"
    judge.write_text(SAMPLING_JUDGE_YAML)
    rows = accented_rows()
    mapping = {"models": MODEL_NAMES, "samples": SAMPLE_NAMES}[kind]
    renamed = [RENAMES[kind](r, mapping) for r in rows]
    for name in ("a", "b", "c"):
        (tmp_path / name).mkdir()
    a = rank(capsys, judge, rows, tmp_path / "a")
    b = rank(capsys, judge, renamed, tmp_path / "b")
    assert_same_numbers(a, b, rename=mapping if kind == "models" else {}, ignore=(r"/warnings/", r"/history/"))
    judge.write_text(SAMPLING_JUDGE_YAML.replace("seed: 0", "seed: 1"))
    c = rank(capsys, judge, rows, tmp_path / "c")
    assert c["W"] != a["W"]


def cached_rank(capsys, judge, rows, folder, cache, extra=()):
    """`rank` on a call cache shared between runs: (the report's cost, the calls the cache holds)."""
    folder.mkdir(parents=True, exist_ok=True)
    table = write_jsonl(folder / "table.jsonl", rows)
    run_ok(capsys, ["rank", "--judge", judge, "--data", table, "--output", folder / "r.json", "--n-boot", 20,
                    "--cache-dir", cache, "--quiet", *extra])  # fmt: skip
    held = sum(len(f.read_text(encoding="utf-8").splitlines()) for f in cache.rglob("*.jsonl"))
    return read_json(folder / "r.json")["cost"], held


@pytest.mark.parametrize("change", ["renamed models", "renamed samples", "shuffled rows"])
def test_a_judge_call_is_found_by_its_content_not_its_names(change, length_judge_yaml, tmp_path, capsys):
    """The call cache finds a call by what the judge reads (`zero_shot.cache.CallKey.content`), never by the names
    of its sample, models or order: the same descriptions under other names, or in another row order, make 0 calls.
    4 models, 6 samples: 6 pairs x 6 samples x 2 orders = 72 calls, each one line of the cache."""
    import random

    rows = table_rows(n_samples=6)
    changed = {
        "renamed models": [RENAMES["models"](r, MODEL_NAMES) for r in rows],
        "renamed samples": [RENAMES["samples"](r, SAMPLE_NAMES) for r in rows],
        "shuffled rows": random.Random(3).sample(rows, len(rows)),
    }[change]
    cache = tmp_path / "cache"
    first, held = cached_rank(capsys, length_judge_yaml, rows, tmp_path / "a", cache)
    assert (first["n_judge_calls"], first["n_reused"], held) == (72, 0, 72)  # the report counts the calls made
    again, held = cached_rank(capsys, length_judge_yaml, changed, tmp_path / "b", cache)
    assert (again["n_judge_calls"], again["n_reused"], held) == (0, 72, 72)


def nfd_pairs(rows):
    return [{**r, "description_1": nfd(r["description_1"]), "description_2": nfd(r["description_2"])} for r in rows]


def accented_pairs() -> list[dict]:
    rows = pair_rows(24)
    for k, r in enumerate(rows):
        r["description_1"] += f" {ACCENTED[k % 7]}"
        r["description_2"] += f" {ACCENTED[(k + 3) % 7]} {ACCENTED[(k + 1) % 7]}"
    return rows


def trl_pairs(rows):
    """The same pairs as a TRL conversational file: chosen / rejected message lists, content as a list of parts."""

    def turn(text):
        return [{"role": "assistant", "content": [{"type": "text", "text": text}]}]

    out = []
    for r in rows:
        chosen, rejected = (
            (r["description_1"], r["description_2"]) if r["label"] == "1" else (r["description_2"], r["description_1"])
        )
        out.append({"sample_id": r["sample_id"], "chosen": turn(chosen), "rejected": turn(rejected)})
    return out


@pytest.mark.parametrize("kind", ["nfd", "sample ids"])
def test_evaluate_is_invariant_to_unicode_forms_and_ids(kind, rm_dir, tmp_path, capsys):
    rows = accented_pairs()
    other = nfd_pairs(rows) if kind == "nfd" else [{**r, "sample_id": f"renamed-{r['sample_id']}"} for r in rows]
    reports = []
    for name, data in (("a", rows), ("b", other)):
        out = tmp_path / name / "e.json"
        run_ok(capsys, ["evaluate", "--model", rm_dir, "--data", write_jsonl(tmp_path / name / "p.jsonl", data),
                        "--output", out])  # fmt: skip
        reports.append(read_json(out))
    rename = {r["sample_id"]: o["sample_id"] for r, o in zip(rows, other)}
    assert_same_numbers(*reports, rename=rename, ignore=(r"markdown$",))


def test_train_reads_trl_content_parts_as_their_text(tiny_bert_dir, tmp_path, capsys):
    rows = pair_rows(24)
    # TRL rows state no order: the reader puts each pair's descriptions in their content order (docs/data.md)
    flip = {"1": "2", "2": "1", "tie": "tie"}
    content_first = [
        r if identity_text(r["description_1"]) <= identity_text(r["description_2"])
        else {**r, "description_1": r["description_2"], "description_2": r["description_1"], "label": flip[r["label"]]}
        for r in rows
    ]  # fmt: skip
    reports = []
    for name, data in (("plain", content_first), ("trl", trl_pairs(rows))):
        folder = tmp_path / name
        run_ok(
            capsys, ["train", "--config", train_recipe(folder, tiny_bert_dir, write_jsonl(folder / "t.jsonl", data))]
        )
        reports.append(read_json(folder / "out" / "report.json")["cross_validation"])
    assert_same_numbers(*reports, ignore=(r"markdown$", r"train_seconds", r"/threads"))


def test_layouts_without_an_order_give_one_order(rm_dir, tmp_path, capsys):
    """The same labelled pairs as TRL chosen / rejected rows and as rows by three annotators (each row in a random
    side order, the third disagreeing) give the same figures, the normal-order two-class WAF included (its classes
    are positions): neither layout states which description is first, so both read the content order
    (`data.pairs.content_ordered`). Before, TRL rows put the chosen side first, so every gold label was "1"."""
    rows = pair_rows(24)
    rows[3]["label"] = rows[7]["label"] = "tie"
    flip = {"1": "2", "2": "1", "tie": "tie"}
    trl, annotated = [], []
    for r in rows:
        chosen, rejected = (r["description_2"], r["description_1"]) if r["label"] == "2" else (r["description_1"],
                                                                                          r["description_2"])  # fmt: skip
        trl.append({"sample_id": r["sample_id"], "chosen": chosen, "rejected": rejected, "tie": r["label"] == "tie"})
    rng = random.Random(3)
    for r in rows:
        for name in "abc":
            label = flip[r["label"]] if name == "c" else r["label"]
            row = {**r, "label": label, "annotator": name}
            if rng.random() < 0.5:
                row.update(description_1=r["description_2"], description_2=r["description_1"], label=flip[label])
            annotated.append(row)
    reports = []
    for name, data in (("trl", trl), ("annotated", annotated)):
        out = tmp_path / f"{name}.json"
        argv = ["evaluate", "--model", rm_dir, "--data", write_jsonl(tmp_path / f"{name}.jsonl", data)]
        run_ok(capsys, [*argv, "--no-controlled-negatives", "--output", out])
        reports.append(read_json(out))
    for part in ("judge", "length_baseline"):
        assert_same_numbers(reports[0][part], reports[1][part])
    gold = {"1": 0, "2": 0}
    for r in rows:
        if r["label"] != "tie":
            first_chosen = (r["label"] == "1") == (
                identity_text(r["description_1"]) <= identity_text(r["description_2"])
            )
            gold["1" if first_chosen else "2"] += 1
    assert gold["1"] and gold["2"]  # both classes of the two-class WAF occur: not every gold label is "1"


def test_train_renamed_annotators_are_the_same_run_and_a_changed_label_another(tiny_bert_dir, tmp_path, capsys):
    """Per-annotator rows with the annotators renamed (a, b, c -> z, x, y: every pair's labels and majority the same)
    and the rows shuffled, rerun into the finished folder through `emoreward train`: the same run, both folds reused
    and the same numbers. One annotator's label changed where the majority stays (pair 1 of sample s0: 1, 1, 1 ->
    1, 1, 2) is another run: exit 2 naming the labels."""
    rows = annotated_pair_rows(n_samples=4)
    recipe = train_recipe(tmp_path, tiny_bert_dir, write_jsonl(tmp_path / "a.jsonl", rows))
    run_ok(capsys, ["train", "--config", recipe])
    before = read_json(tmp_path / "out" / "report.json")
    names = {"a": "z", "b": "x", "c": "y"}
    renamed = write_jsonl(
        tmp_path / "renamed.jsonl", shuffled([{**r, "annotator": names[r["annotator"]]} for r in rows])
    )
    text = run_ok(capsys, ["train", "--config", recipe, "--train_file", renamed])
    assert text.count("finished earlier, reusing") == 2, text
    after = read_json(tmp_path / "out" / "report.json")
    assert_same_numbers(before["cross_validation"], after["cross_validation"], ignore=(r"markdown$",))
    assert after["annotators"] == before["annotators"]  # 3 annotators, the same agreement
    # pair 1 of s0 (the second negative): a, b and c all prefer the original; c's row now prefers the negative
    k = next(i for i, r in enumerate(rows) if r["sample_id"] == "s0" and "sullen" in r["description_1"] + r["description_2"]
             and r["annotator"] == "c")  # fmt: skip
    changed = [dict(r) for r in rows]
    changed[k]["label"] = {"1": "2", "2": "1"}[changed[k]["label"]]
    code, _, err = run_cli(
        capsys, ["train", "--config", recipe, "--train_file", write_jsonl(tmp_path / "c.jsonl", changed)]
    )
    assert code == 2 and "the labels (the same pairs with other preference labels)" in err, err


# ------------------------------------------------------------------------------------------------- RL routes

SHAPES = {
    "string": lambda text: text,
    "message": lambda text: [{"role": "assistant", "content": text}],
    "content parts": lambda text: [{"role": "assistant", "content": [{"type": "text", "text": text}]}],
    "nfd string": lambda text: nfd(text),
    "nfd parts": lambda text: [{"role": "assistant", "content": [{"type": "text", "text": nfd(text)}]}],
}
# the length monitor of a route counts the calls it has seen: those counters grow from one call to the next
MONITOR_COUNTS = (r"length/(n|seen|window_batches)(/|$)",)
TEXTS = [f"The woman is {w}, {ACCENTED[k]} and smiling." for k, w in enumerate(["calm", "tense", "joyful", "sad"])]


@pytest.mark.parametrize("shape", list(SHAPES))
def test_grpo_reward_is_the_same_for_every_shape_of_a_completion(shape, bpe_rm_dir):
    from emoreward.export.grpo import EmotionReward

    prompts = [[{"role": "user", "content": "Describe the emotion. Subtitle: hola"}]] * len(TEXTS)
    first, second = EmotionReward(str(bpe_rm_dir)), EmotionReward(str(bpe_rm_dir))  # each its own length monitor
    assert_same_rewards(second(prompts, [SHAPES[shape](t) for t in TEXTS]), first(prompts, TEXTS))
    assert_same_numbers(first.last_length_figures, second.last_length_figures)


def test_a_subtitle_in_two_unicode_forms_is_one_subtitle(bpe_rm_dir, rm_dir, tmp_path, capsys):
    """A subtitle given in NFC in one place and NFD in another (a GRPO column and the prompt's `Subtitle:` line; two
    rows of one sample in a table) is one subtitle: the same rewards and ranking, never a conflict."""
    from emoreward.export.grpo import EmotionReward

    subtitle = "J'ai été reçue à l'école!"
    column = {"subtitle": [subtitle] * len(TEXTS)}
    prompts = [[{"role": "user", "content": f"Describe the emotion.\nSubtitle: {subtitle}"}]]
    nfd_prompts = [[{"role": "user", "content": f"Describe the emotion.\nSubtitle: {nfd(subtitle)}"}]]
    want = EmotionReward(str(bpe_rm_dir))(prompts * len(TEXTS), TEXTS, **column)
    got = EmotionReward(str(bpe_rm_dir))(nfd_prompts * len(TEXTS), TEXTS, **column)
    assert_same_rewards(got, want)

    rows = table_rows(4, subtitle=True)
    mixed = [
        {**r, "subtitle": nfd(r["subtitle"] + " é") if k % 2 else r["subtitle"] + " é"} for k, r in enumerate(rows)
    ]
    one = [{**r, "subtitle": r["subtitle"] + " é"} for r in rows]
    reports = []
    for name, table in (("one", one), ("mixed", mixed)):
        data = write_jsonl(tmp_path / f"{name}.jsonl", table)
        out = tmp_path / f"{name}.json"
        run_ok(
            capsys,
            [
                "rank",
                "--judge",
                rm_dir,
                "--data",
                data,
                "--output",
                out,
                "--n-boot",
                "5",
                "--cache-dir",
                tmp_path / f"cache-{name}",
                "--no-length-control",
            ],
        )
        reports.append(read_json(out))
    assert_same_numbers(reports[0], reports[1], ignore=(r"seconds", r"n_cached", r"n_scored", r"path", r"cache"))


def test_a_table_reencoded_in_the_other_unicode_form_is_ranked_from_the_score_cache(bpe_rm_dir, tmp_path, capsys):
    """rtG2 g05: the same table in NFD, then in NFC (descriptions and subtitles), on one score cache: the rerun scores
    nothing (its 24 descriptions all from the cache: `score_key` and `subtitle_key` key the form the model reads,
    `normal_text`) and its numbers equal a fresh NFC ranking's. The byte-level BPE model reads the two forms as
    different tokens, so this holds only because every model scores the normal form (`emoreward.models.layout`)."""
    rows = [{**r, "subtitle": f"Ça va, Élodie? ({r['sample']})"} for r in accented_rows(6)]
    nfd_rows = [{**r, "description": nfd(r["description"]), "subtitle": nfd(r["subtitle"])} for r in rows]
    cache = tmp_path / "cache"
    reports = {}
    for name, table, keep in (("nfd", nfd_rows, ["--cache-dir", cache]), ("nfc", rows, ["--cache-dir", cache]),
                              ("fresh", rows, ["--no-cache"])):  # fmt: skip
        out = tmp_path / name / "r.json"
        out.parent.mkdir()
        run_ok(capsys, ["rank", "--judge", bpe_rm_dir, "--data", write_jsonl(out.parent / "t.jsonl", table),
                        "--output", out, "--n-boot", 20, "--quiet", *keep])  # fmt: skip
        reports[name] = read_json(out)
    costs = {name: (r["cost"]["n_scored"], r["cost"]["n_cached"]) for name, r in reports.items()}
    assert costs == {"nfd": (24, 0), "nfc": (0, 24), "fresh": (24, 0)}
    # truncation is one fact, the per-model `n_truncated` (cached runs included), never a second count in the cost
    assert not any("n_truncated" in r["cost"] for r in reports.values())
    assert sum(reports["nfc"]["n_truncated"].values()) == sum(reports["fresh"]["n_truncated"].values()) > 0
    ignore = (r"n_cached", r"n_scored", r"cache", r"path")
    assert_same_numbers(reports["nfc"], reports["fresh"], ignore=ignore)
    assert_same_numbers(reports["nfd"], reports["nfc"], ignore=ignore)


def test_score_and_verl_are_the_same_for_both_unicode_forms(bpe_rm_dir):
    from emoreward.export.verl import compute_score
    from emoreward.models import load_reward_model

    model = load_reward_model(bpe_rm_dir)
    decomposed = [nfd(t) for t in TEXTS]
    assert_same_rewards(model.score(decomposed, nfd("señal")), model.score(TEXTS, "señal"))
    for text, original in zip(decomposed, TEXTS):
        got = compute_score("emotion", text, "hola", {}, model=str(bpe_rm_dir), subtitle_key="ground_truth")
        want = compute_score("emotion", original, "hola", {}, model=str(bpe_rm_dir), subtitle_key="ground_truth")
        # the route's length monitor keeps a window over every call so far: the grpo test compares fresh ones
        assert_same_numbers(want, got, ignore=(r"length/",))


def test_openrlhf_routes_are_the_same_for_both_unicode_forms(bpe_rm_dir, monkeypatch):
    from _helpers import post_json

    from emoreward.export.serve import reward_func
    from emoreward.export.serve.http import RewardServer
    from emoreward.export.serve.service import RewardService
    from emoreward.models import load_reward_model

    prompt = "<|im_start|>user\nDescribe the emotion.\nSubtitle: hola<|im_end|>\n<|im_start|>assistant\n"
    queries = [prompt + t + "<|im_end|>" for t in TEXTS]
    decomposed = [prompt + nfd(t) + "<|im_end|>" for t in TEXTS]
    with RewardServer(RewardService(load_reward_model(bpe_rm_dir)), port=0) as server:
        _, a = post_json(server.host, server.port, "/get_reward", {"query": queries, "prompts": [prompt] * 4})
        _, b = post_json(server.host, server.port, "/get_reward", {"query": decomposed, "prompts": [prompt] * 4})
    assert_same_numbers(a, b, ignore=MONITOR_COUNTS)

    monkeypatch.setenv("EMOREWARD_RM_MODEL", str(bpe_rm_dir))
    x = reward_func.reward_func(queries, [prompt] * 4, [None] * 4)
    y = reward_func.reward_func(decomposed, [prompt] * 4, [None] * 4)
    for key in ("rewards", "scores"):
        assert_same_rewards(y[key].numpy(), x[key].numpy())
    assert_same_numbers(
        {k: v.tolist() for k, v in x["extra_logs"].items()},
        {k: v.tolist() for k, v in y["extra_logs"].items()},
        ignore=MONITOR_COUNTS,
    )


def test_identical_descriptions_are_counted_in_their_identity_form():
    """`evaluate`'s count of pairs whose two descriptions are one text (always ties) reads every form of one text:
    the other Unicode form, CRLF line endings and outer spaces (`identity_text`)."""
    from emoreward.data import PreferencePair
    from emoreward.evaluation.harness import identical_descriptions

    text = "Elle est ravie.\nUn sourire, café à la main."
    forms = {"same": text, "nfd": nfd(text), "crlf": text.replace("\n", "\r\n"), "padded": f"  {text}\n"}
    pairs = [PreferencePair(name, text, other, "tie") for name, other in forms.items()]
    pairs.append(PreferencePair("different", text, text + " Puis triste.", "1"))
    assert identical_descriptions(pairs) == ["same", "nfd", "crlf", "padded"]


def test_renamed_and_shuffled_pairs_train_on_the_same_controlled_negatives_in_the_same_order(tmp_path):
    """A fit's controlled negatives come in the order of their content (`Negative.sort_key`), not of the sample ids:
    a renamed file trains the same batches (before: sorted by sample id, another model)."""
    import dataclasses

    import yaml
    from test_training_negatives import emotional_pairs

    from emoreward.training.config import load_config
    from emoreward.training.negatives import training_pairs

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"model_name_or_path": "minilm", "report_to": ["none"],
                                      "controlled_negatives": ["all"]}))  # fmt: skip
    pairs = emotional_pairs(8)
    renamed = [dataclasses.replace(p, sample_id=f"zz{9 - int(p.sample_id[1:])}") for p in pairs]
    random.Random(3).shuffle(renamed)
    config = load_config(recipe)
    by_content = [sorted(ps, key=lambda p: (p.description_1, p.description_2)) for ps in (pairs, renamed)]
    got = [training_pairs(config, ps) for ps in by_content]  # the pipeline hands a fit its pairs in content order
    texts = [[(p.description_1, p.description_2) for p in g.pairs[g.n_human :]] for g in got]
    assert texts[0] == texts[1] and len(texts[0]) > 8 and got[0].edits == got[1].edits
