"""OpenRLHF, both of its routes (issue 23, item 2): ``POST /get_reward`` answers an empty query (OpenRLHF with
several endpoints splits a batch over them), and the Python reward file OpenRLHF loads by path scores in-process,
loading the model once, with the same decoding and context rule as the server."""

import asyncio
import importlib.util

import numpy as np
import pytest
import torch
from _helpers import StubRewardModel, assert_same_rewards, post_json

import emoreward.export.serve.reward_func as reward_file
from emoreward.export.length_monitor import SAMPLE_KEYS
from emoreward.export.serve.http import RewardServer
from emoreward.export.serve.local import shared_batcher
from emoreward.export.serve.service import RewardService
from emoreward.models import load_reward_model
from emoreward.models.base import RewardContext


def post(server, path, payload):
    return post_json(server.host, server.port, path, payload, timeout=30)


class Words(StubRewardModel):
    def reward(self, description, subtitle):
        return len(description.split()) / 10 + (1.0 if subtitle else 0.0)


def test_an_empty_query_gets_empty_rewards_and_every_key():
    with RewardServer(RewardService(Words(), openrlhf_labels="subtitle"), port=0) as srv:
        for body in ({"query": [], "labels": []}, {"query": [], "prompts": [], "labels": []}):
            status, data = post(srv, "/get_reward", body)
            assert status == 200, data
            assert data["rewards"] == [] and data["scores"] == [] and data["truncated"] == [] and data["empty"] == []
            # every key of a share of one or more (OpenRLHF concatenates extra_logs key by key), as empty lists
            assert data["extra_logs"] == {
                "emotion_reward": [],
                "emotion_reward_truncated": [],
                "emotion_reward_empty": [],
                **{key: [] for key in SAMPLE_KEYS},
            }
        status, data = post(srv, "/get_reward", {"query": [], "prompts": ["p"], "labels": []})
        assert status == 400 and "'prompts' has 1 items for 0 queries" in data["error"]
        assert post(srv, "/v1/rewards", {"descriptions": []})[0] == 400  # our own endpoint still wants descriptions
    assert srv.service.stats.requests == 2 and srv.service.stats.batches == 0  # never queued, no model call


PROMPT = "<|im_start|>user\nDescribe the emotion in the clip.<|im_end|>\n<|im_start|>assistant\n"
DESCRIPTIONS = ["She smiles broadly: happy.", "He frowns and shouts, ANGRY!", " Calm.", ""] * 8
SUBTITLES = ["I won!", None, "Leave me alone.", "ok"] * 8


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory, tiny_bert_dir):
    from transformers import AutoTokenizer, BertForSequenceClassification

    from emoreward.models import TextRewardModel, TextSettings

    model = TextRewardModel(
        BertForSequenceClassification.from_pretrained(tiny_bert_dir, dtype=torch.float32),
        AutoTokenizer.from_pretrained(tiny_bert_dir),
        TextSettings(backbone="tiny-bert", input_format="pair", max_length=64),
    )
    path = tmp_path_factory.mktemp("rm") / "model"
    model.save_pretrained(path)
    return path


def load_like_openrlhf():
    """`SingleTurnAgentExecutor.__init__` (OpenRLHF 0.11): the file is executed as a module named reward_func."""
    spec = importlib.util.spec_from_file_location("reward_func", reward_file.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.reward_func


def as_openrlhf_experience(info):
    """What `SamplesGenerator._process_response_into_experience` (OpenRLHF 0.11) makes of one sample's reply."""
    out = {"reward": torch.tensor([info["rewards"]]), "score": torch.tensor([info["scores"]])}
    for key, value in info["extra_logs"].items():
        if isinstance(value, torch.Tensor):
            value = value.flatten()[0].item()
        out[key] = torch.tensor([value])
    return out


def test_the_python_reward_file_scores_like_the_server_loading_the_model_once(saved_model, monkeypatch):
    monkeypatch.setenv("EMOREWARD_DTYPE", "float32")  # fp32 on every CPU: rewards do not depend on the batch
    monkeypatch.setenv("EMOREWARD_RM_MODEL", str(saved_model))
    monkeypatch.setenv("EMOREWARD_RM_LABELS", "subtitle")
    queries = [PROMPT + d + "<|im_end|>" for d in DESCRIPTIONS]
    first, second = load_like_openrlhf(), load_like_openrlhf()  # two executors in one process

    async def rollout():  # `_fetch_rewards_via_func`: one sample per call, each in a thread, all at once
        calls = [
            asyncio.to_thread(fn, [q], [PROMPT], [s])
            for k, (q, s) in enumerate(zip(queries, SUBTITLES))
            for fn in [first if k % 2 else second]
        ]
        return await asyncio.gather(*calls)

    infos = asyncio.run(rollout())
    experiences = [as_openrlhf_experience(info) for info in infos]
    rewards = torch.cat([e["reward"] for e in experiences]).numpy()
    model = load_reward_model(str(saved_model))
    expected = model.score(DESCRIPTIONS, [RewardContext(s) for s in SUBTITLES])
    assert len(set(np.round(expected[:4], 6))) == 4  # the four samples differ
    assert_same_rewards(rewards, expected)
    assert torch.equal(torch.cat([e["score"] for e in experiences]), torch.cat([e["reward"] for e in experiences]))
    assert [float(e["emotion_reward_empty"][0]) for e in experiences[:4]] == [0.0, 0.0, 0.0, 1.0]
    # the server's /get_reward gives the same rewards for the same request
    with RewardServer(RewardService(model, openrlhf_labels="subtitle"), port=0) as srv:
        status, data = post(srv, "/get_reward", {"query": queries, "prompts": [PROMPT] * 32, "labels": SUBTITLES})
    assert status == 200
    assert_same_rewards(data["rewards"], rewards)
    # one model per process: both loaded copies of the file scored with the same service
    batcher = shared_batcher(saved_model, openrlhf_labels="subtitle", settings_in="environment")  # the file's
    assert batcher.service.stats.requests == 32 and batcher.service.stats.batches <= 32
    # a whole batch in one call (older OpenRLHF) and an empty one
    info = first(queries[:4], [PROMPT] * 4, SUBTITLES[:4])
    assert info["rewards"].shape == (4,) and np.allclose(info["rewards"].numpy(), expected[:4], atol=1e-6, rtol=0)
    assert first([], [], [])["rewards"].shape == (0,)


def test_the_python_reward_file_errors_name_the_sample(saved_model, monkeypatch):
    monkeypatch.delenv("EMOREWARD_RM_MODEL", raising=False)
    fn = load_like_openrlhf()
    with pytest.raises(ValueError, match="set EMOREWARD_RM_MODEL"):
        fn(["x"], ["p"], [None])
    monkeypatch.setenv("EMOREWARD_DTYPE", "float32")
    monkeypatch.setenv("EMOREWARD_RM_MODEL", str(saved_model))
    with pytest.raises(ValueError, match=r"query\[0\] does not start with prompts\[0\]"):
        fn(["something else"], [PROMPT], [None])
    # a fork passing labels=None (no references) is scored as with labels ignored, the default
    query = [PROMPT + DESCRIPTIONS[0] + "<|im_end|>"]
    assert torch.equal(fn(query, [PROMPT], None)["rewards"], fn(query, [PROMPT], [None])["rewards"])


def test_a_query_with_a_chat_prompt_and_no_prompts_is_refused_naming_prompts():
    """Without 'prompts' a query is the response alone; one that holds a chat prompt (an older OpenRLHF, or a client
    that sends only 'query') is a 400 naming 'prompts', never a reward of prompt + response."""
    with RewardServer(RewardService(Words()), port=0) as srv:
        status, data = post(srv, "/get_reward", {"query": [PROMPT + "She smiles.<|im_end|>"]})
        assert status == 400 and "query[0] holds a chat prompt ('<|im_start|>')" in data["error"], data
        assert "'prompts'" in data["error"]
        status, data = post(srv, "/get_reward", {"query": [PROMPT + "She smiles.<|im_end|>"], "prompts": [PROMPT]})
        assert status == 200 and data["rewards"] == [0.2]  # the response alone: two words
        status, data = post(srv, "/get_reward", {"query": ["She smiles.<|im_end|>"]})  # the response alone
        assert status == 200 and data["rewards"] == [0.2]


def test_clip_labels_are_refused_for_a_text_model_before_any_request(saved_model, monkeypatch):
    """`--openrlhf-labels clip` names each sample's clip, and a text model reads none (a bare id was a 400 "use
    --allow-unused-media", the same clip as an object a 200, a path a 400 "name the sample id"): refused where the
    service is built, with or without --allow-unused-media, named as the user set it (the reward file's variable)."""
    model = load_reward_model(str(saved_model))
    for allow in (False, True):
        with pytest.raises(ValueError, match=r"--openrlhf-labels clip applies to reward models that read media"):
            RewardService(model, openrlhf_labels="clip", allow_unused_media=allow)
    fn = load_like_openrlhf()
    monkeypatch.setenv("EMOREWARD_RM_MODEL", str(saved_model))
    monkeypatch.setenv("EMOREWARD_RM_LABELS", "clip")
    with pytest.raises(ValueError, match=r"EMOREWARD_RM_LABELS=clip applies to reward models that read media"):
        fn([PROMPT + DESCRIPTIONS[0] + "<|im_end|>"], [PROMPT], ["s0042"])


@pytest.mark.parametrize(
    "variable, value, message",
    [
        ("EMOREWARD_RM_BATCH_SIZE", "-3", "EMOREWARD_RM_BATCH_SIZE=-3: expected an integer in [1, 2,147,483,647]"),
        ("EMOREWARD_RM_BATCH_SIZE", "eight", "EMOREWARD_RM_BATCH_SIZE=eight: expected an integer"),
        ("EMOREWARD_RM_LABEL", "subtitle", "unknown setting EMOREWARD_RM_LABEL (the OpenRLHF reward file reads "
         "EMOREWARD_RM_BATCH_SIZE, EMOREWARD_RM_LABELS, EMOREWARD_RM_MEDIA_ROOT, EMOREWARD_RM_MODEL, "
         "EMOREWARD_RM_QUERY_MARKERS, EMOREWARD_RM_VLLM_URL)"),
        ("EMOREWARD_RM_LABELS", "bogus", "EMOREWARD_RM_LABELS=bogus: expected one of ignore, subtitle, clip"),
    ],
    ids=["negative-batch-size", "batch-size-not-a-number", "misspelt-variable", "unknown-label-mode"],
)  # fmt: skip
def test_every_reward_file_setting_is_checked_naming_its_variable(saved_model, monkeypatch, variable, value, message):
    """OpenRLHF's reward file reads its settings from `EMOREWARD_RM_*` variables: an out-of-range value or a misspelt
    variable (scored as if unset before) is a ValueError naming it, before the model loads, as a bad label mode was."""
    fn = load_like_openrlhf()
    monkeypatch.setenv("EMOREWARD_RM_MODEL", str(saved_model))
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError) as refused:
        fn([PROMPT + DESCRIPTIONS[0] + "<|im_end|>"], [PROMPT], ["I got the job!"])
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_the_reward_file_refuses_a_media_root_for_a_text_model(saved_model, monkeypatch, tmp_path):
    """`EMOREWARD_RM_MEDIA_ROOT` applies to multimodal models, as `serve --media-root` does: with a text model the
    reward file raises before it scores (`open_reward_model` refuses it) instead of ignoring it."""
    fn = load_like_openrlhf()
    monkeypatch.setenv("EMOREWARD_DTYPE", "float32")
    monkeypatch.setenv("EMOREWARD_RM_MODEL", str(saved_model))
    monkeypatch.setenv("EMOREWARD_RM_MEDIA_ROOT", str(tmp_path))
    query = [PROMPT + DESCRIPTIONS[0] + "<|im_end|>"]
    with pytest.raises(ValueError, match=r"media_root \(.*\) applies to multimodal reward models: .* is a text model"):
        fn(query, [PROMPT], [None])
    monkeypatch.delenv("EMOREWARD_RM_MEDIA_ROOT")
    assert fn(query, [PROMPT], [None])["rewards"].shape == (1,)  # the same model without it scores


def test_a_clip_label_names_one_sample_whatever_its_form():
    """A media path in the media root's layout names the sample of the id form (the per-sample records of ``s1`` and
    ``video/s1.mp4`` agree); a path outside the layout is its own name."""
    from emoreward.export.serve.routes.openrlhf import clip_from_label

    video = frozenset({"video"})
    by_id = clip_from_label("s1", "labels[0]", video, False)
    by_path = clip_from_label("video/s1.mp4", "labels[0]", video, False)
    assert by_id == by_path == {"sample_id": "s1", "video": "video/s1.mp4"}
    audio = clip_from_label("audio/s1.wav", "labels[0]", frozenset({"audio"}), False)
    assert audio == {"sample_id": "s1", "audio": "audio/s1.wav"}
    assert clip_from_label("clips/s1.mp4", "labels[0]", video, False)["sample_id"] == "clips/s1.mp4"
    assert clip_from_label("video/a/s1.mp4", "labels[0]", video, False)["sample_id"] == "video/a/s1.mp4"
