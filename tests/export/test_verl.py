"""The verl custom reward functions, called the way verl calls them (reimplemented from github.com/volcengine/verl:
`verl/utils/import_utils.py::load_extern_object`, `verl/trainer/ppo/reward.py::get_custom_reward_fn` and the
`naive` / `batch` reward managers), against a running `emoreward serve` and a model loaded in process."""

import importlib
import importlib.util
import os
from functools import partial
from pathlib import Path

import bpe_chat
import numpy as np
import pytest
import torch
from _helpers import assert_same_rewards

import emoreward.export.verl as verl_module
from emoreward.export.serve.http import RewardServer
from emoreward.export.serve.service import RewardService
from emoreward.models import load_reward_model
from emoreward.models.precision import model_precision, reward_tolerance


DESCRIPTIONS = ["She smiles broadly; her voice rises: happy.", "  He is calm.\nThen he frowns, ANGRY!  ", "Sad."]
SUBTITLES = ["I got the job!", None, "Leave me alone."]


# ---------------------------------------------------------------------------------------------- verl, reimplemented
def load_extern_object(module_path: str, object_name: str):
    """verl's loader: ``pkg://a.b.c`` imports the module, any other path is executed as a file under a new name."""
    if module_path.startswith("pkg://"):
        module = importlib.import_module(module_path[len("pkg://") :].replace("/", "."))
    else:
        spec = importlib.util.spec_from_file_location(
            f"custom_module_{hash(os.path.abspath(module_path))}", module_path
        )
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return getattr(module, object_name)


def _call_with_kwargs(raw_fn, extra_kwargs, *args, **kwargs):
    return raw_fn(*args, **{**kwargs, **extra_kwargs})


def get_custom_reward_fn(config: dict):
    fn = config["custom_reward_function"]
    raw_fn = load_extern_object(module_path=fn["path"], object_name=fn["name"])
    return partial(_call_with_kwargs, raw_fn, dict(fn.get("reward_kwargs", {})))


def rollout_batch(tok, descriptions):
    """verl's DataProto tensors: prompts left-padded, responses right-padded after their EOS, one attention mask."""
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "Describe it."}], tokenize=False, add_generation_prompt=True
    )
    prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    responses = [tok(d, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for d in descriptions]
    width = max(map(len, responses)) + 2
    batch = {"prompts": [], "responses": [], "attention_mask": []}
    for k, r in enumerate(responses):
        left = k % 2  # uneven prompt padding
        p = [tok.pad_token_id] * left + prompt_ids
        batch["prompts"].append(p)
        batch["responses"].append(r + [tok.pad_token_id] * (width - len(r)))
        batch["attention_mask"].append([0] * left + [1] * len(prompt_ids) + [1] * len(r) + [0] * (width - len(r)))
    pw = max(map(len, batch["prompts"]))
    for k in range(len(responses)):  # one prompt width for the batch
        extra = pw - len(batch["prompts"][k])
        batch["prompts"][k] = [tok.pad_token_id] * extra + batch["prompts"][k]
        batch["attention_mask"][k] = [0] * extra + batch["attention_mask"][k]
    return {key: torch.tensor(value) for key, value in batch.items()}


def naive_reward_manager(tok, compute_score, batch, non_tensor):
    """verl's NaiveRewardManager.__call__ (one compute_score call per sample, reward at the last response token)."""
    reward_tensor = torch.zeros_like(batch["responses"], dtype=torch.float32)
    extra = {}
    prompt_length = batch["prompts"].shape[-1]
    for i in range(len(batch["responses"])):
        valid_response_length = batch["attention_mask"][i][prompt_length:].sum()
        valid_response_ids = batch["responses"][i][:valid_response_length]
        response_str = tok.decode(valid_response_ids, skip_special_tokens=True)
        score = compute_score(
            data_source=non_tensor["data_source"][i],
            solution_str=response_str,
            ground_truth=non_tensor["reward_model"][i]["ground_truth"],
            extra_info=non_tensor["extra_info"][i],
        )
        for key, value in score.items():
            extra.setdefault(key, []).append(value)
        reward_tensor[i, valid_response_length - 1] = score["score"]
    return reward_tensor, extra


def batch_reward_manager(tok, compute_score, batch, non_tensor):
    """verl's BatchRewardManager.verify: one compute_score call for the batch."""
    prompt_len = batch["prompts"].shape[-1]
    lengths = batch["attention_mask"][:, prompt_len:].sum(dim=-1)
    responses = [
        tok.decode(batch["responses"][i][: lengths[i]], skip_special_tokens=True) for i in range(len(lengths))
    ]
    return compute_score(
        data_sources=non_tensor["data_source"],
        solution_strs=responses,
        ground_truths=[r.get("ground_truth", None) for r in non_tensor["reward_model"]],
        extra_infos=non_tensor["extra_info"],
    )


@pytest.fixture(scope="module")
def tok():
    return bpe_chat.qwen_like_tokenizer()


@pytest.fixture(scope="module")
def reward_model(tok):
    return bpe_chat.tiny_chat_reward_model(tok)


@pytest.fixture()
def non_tensor():
    return {
        "data_source": ["emotion"] * 3,
        "reward_model": [{"ground_truth": "", "style": "model"}] * 3,
        "extra_info": [{"subtitle": s, "sample_id": f"s{k}"} for k, s in enumerate(SUBTITLES)],
    }


def test_naive_manager_with_a_running_server_and_a_token(tok, reward_model, non_tensor, monkeypatch):
    monkeypatch.setenv("EMOREWARD_SERVE_TOKEN", "verl-secret")
    batch = rollout_batch(tok, DESCRIPTIONS)
    with RewardServer(RewardService(reward_model), port=0, token="verl-secret") as srv:
        config = {
            "custom_reward_function": {
                "path": "pkg://emoreward.export.verl",
                "name": "compute_score",
                "reward_kwargs": {"server_url": srv.url},
            }
        }
        reward_tensor, extra = naive_reward_manager(tok, get_custom_reward_fn(config), batch, non_tensor)
        assert srv.service.stats.requests == 3
        verl_module.close_pools()  # the pool's keep-alive connections would hold the server's stop
    expected = reward_model.score(DESCRIPTIONS, SUBTITLES)
    lengths = batch["attention_mask"][:, batch["prompts"].shape[-1] :].sum(-1)
    got = [float(reward_tensor[i, lengths[i] - 1]) for i in range(3)]
    assert_same_rewards(got, expected, "float32")  # verl keeps rewards in float32
    assert float(reward_tensor.abs().sum()) == pytest.approx(float(np.abs(np.float32(got)).sum()))  # nothing else set
    assert extra["truncated"] == [0.0] * 3 and extra["empty"] == [0.0] * 3


@pytest.mark.precision  # depends on the scoring precision: `make test-precision` runs it in the other one
def test_batch_manager_with_a_local_model_loaded_from_the_module_file(tok, reward_model, non_tensor, tmp_path):
    reward_model.save_pretrained(tmp_path / "rm")
    config = {
        "custom_reward_function": {
            "path": verl_module.__file__,  # a file path: verl executes it as a module of its own
            "name": "compute_score_batch",
            "reward_kwargs": {"model": str(tmp_path / "rm")},
        }
    }
    scores = batch_reward_manager(tok, get_custom_reward_fn(config), rollout_batch(tok, DESCRIPTIONS), non_tensor)
    dtype = model_precision(load_reward_model(tmp_path / "rm"))  # what the module's loaded model scores in here
    expected = reward_model.inference_copy(dtype).score(DESCRIPTIONS, SUBTITLES)  # like with like
    np.testing.assert_allclose([s["score"] for s in scores], expected, atol=reward_tolerance(dtype), rtol=0)
    # the ground truth as the subtitle
    per_sample = verl_module.compute_score(
        data_source="emotion",
        solution_str=DESCRIPTIONS[0],
        ground_truth="I got the job!",
        extra_info={},
        model=str(tmp_path / "rm"),
        subtitle_key="ground_truth",
    )
    # alone or in a batch of 3: the same reward within the precision's bound (bf16: batch composition moves it)
    assert per_sample["score"] == pytest.approx(
        scores[0]["score"], abs=reward_tolerance(dtype, magnitude=abs(scores[0]["score"]))
    )


def test_errors_are_raised_not_turned_into_rewards(reward_model):
    with pytest.raises(ValueError, match="exactly one of"):
        verl_module.compute_score(solution_str="x", extra_info={})
    with pytest.raises(ValueError, match=r"unknown reward_kwargs \['servr_url'\]"):
        verl_module.compute_score(solution_str="x", servr_url="http://x")
    # verl's own plumbing arguments are accepted and unused
    with RewardServer(RewardService(reward_model), port=0) as srv:
        got = verl_module.compute_score(solution_str="Sad.", server_url=srv.url, reward_router_address=None)
        assert got["score"] == pytest.approx(float(reward_model.score(["Sad."])[0]), abs=1e-6)
        with pytest.raises(RuntimeError, match="answered 400.*text-only"):
            verl_module.compute_score(solution_str="x", extra_info={"video": "a.mp4"}, server_url=srv.url)
        with pytest.raises(RuntimeError, match="answered 401"):
            os.environ["EMOREWARD_SERVE_TOKEN"] = "wrong"
            try:
                srv.token = "right"
                verl_module.compute_score(solution_str="x", server_url=srv.url)
            finally:
                srv.token = None
                del os.environ["EMOREWARD_SERVE_TOKEN"]
        port = srv.port
        verl_module.close_pools()
    with pytest.raises(RuntimeError, match="gave no answer to /v1/rewards within 2 s"):
        verl_module.compute_score(solution_str="x", server_url=f"http://127.0.0.1:{port}", retries=2, timeout=2)


@pytest.mark.parametrize(
    "given, mode",
    [({"token_env": "X"}, "model"), ({"timeout": 3}, "model"), ({"retries": 2}, "model"),
     ({"merge_samples": 4}, "model"), ({"media_root": "."}, "server_url")],
    ids=["token_env", "timeout", "retries", "merge_samples", "media_root-with-servers"],
)  # fmt: skip
def test_reward_kwargs_that_cannot_apply_in_the_mode_used_are_refused(reward_model, tmp_path, given, mode):
    """A server client's settings with a model in this process (nothing would read them), a media root with servers
    (they resolve media in their own --media-root): refused naming the kwarg, never scored as if unset. A media
    root for a text model is refused where the model opens (`open_reward_model`), through the same call."""
    reward_model.save_pretrained(tmp_path / "rm")
    where = {"model": str(tmp_path / "rm")} if mode == "model" else {"server_url": "http://127.0.0.1:9"}
    name = next(iter(given))
    with pytest.raises(ValueError, match=rf"reward_kwargs (\['{name}'\] are for emoreward servers|'{name}' is for)"):
        verl_module.compute_score(solution_str="Sad.", extra_info={}, **where, **given)
    # the same kwarg in the mode it is for is taken (a server client: checked before any request)
    if mode == "model":
        with pytest.raises(ValueError, match="exactly one of"):
            verl_module.compute_score(solution_str="Sad.", **given)


def test_module_file_is_loadable_standalone():
    path = Path(verl_module.__file__)
    assert load_extern_object(str(path), "compute_score").__name__ == "compute_score"


def test_the_docs_config_calls_the_documented_function(reward_model):
    import yaml

    page = (Path(__file__).resolve().parents[2] / "docs" / "serving.md").read_text()
    section = page[page.index("### verl") :]
    config = yaml.safe_load(section.split("```yaml\n", 1)[1].split("```", 1)[0])
    assert config["custom_reward_function"]["path"] == "pkg://emoreward.export.verl"
    with RewardServer(RewardService(reward_model), port=0) as srv:
        config["custom_reward_function"]["reward_kwargs"]["server_url"] = srv.url
        score = get_custom_reward_fn(config)(
            data_source="emotion", solution_str="Sad.", ground_truth="", extra_info={}
        )
        verl_module.close_pools()
    assert score["score"] == pytest.approx(float(reward_model.score(["Sad."])[0]), abs=1e-6)


def test_an_empty_shard_is_an_empty_list_on_every_route(reward_model, tmp_path):
    """verl may hand a worker an empty batch: no rewards, no error, on a server and in process, as `/get_reward`
    answers an empty query; the options are still checked."""
    model_dir = reward_model.save_pretrained(tmp_path / "model")
    assert verl_module.compute_score_batch([], [], [], [], model=str(model_dir)) == []
    with RewardServer(RewardService(reward_model), port=0) as srv:
        assert verl_module.compute_score_batch([], [], [], [], server_url=srv.url) == []
    verl_module.close_pools()
    with pytest.raises(ValueError, match="exactly one of"):
        verl_module.compute_score_batch([], [], [], [])
