"""Real vLLM (the CPU build, in its own virtual environment) serving emoreward exports on 127.0.0.1: ``/classify``
rewards equal `load_reward_model(export).score` in float32, for the default text reward model (MiniLM + LoRA, the
``pair`` layout) and a decoder reward model (Llama on a ChatML byte-level BPE tokenizer, the ``chat`` layout,
served with the export's chat template); a request built from the export's files alone (no emoreward import) gets
the same rewards; a server that serves another export is refused; ``rank`` and ``evaluate`` with ``--vllm-url``, the
verl and OpenRLHF adapters and TRL GRPO's `EmotionReward` pointed at vLLM give the rewards of the in-process model
and of ``emoreward serve``.

The servers run in vLLM's interpreter ($EMOREWARD_VLLM_PYTHON, default ``.venv-vllm/bin/python``; `make test-vllm`
installs it); these tests run in the project's. Marked ``vllm`` and ``slow``: `make test-vllm` runs them, with
``EMOREWARD_REQUIRE_VLLM=1`` (a missing vLLM environment fails instead of skipping)."""

from __future__ import annotations

import asyncio
import http.client
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import bpe_chat
import numpy as np
import pytest
import torch
from _helpers import assert_same_rewards, minilm_dir

from emoreward.data.context import RewardContext
from emoreward.export.hf import export_hf
from emoreward.export.vllm import VllmRewardModel, VllmServer, served_name
from emoreward.models import load_reward_model


pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = os.environ.get("EMOREWARD_VLLM_PYTHON") or str(ROOT / ".venv-vllm" / "bin" / "python")
if not Path(VLLM_PYTHON).is_file():
    if os.environ.get("EMOREWARD_REQUIRE_VLLM") == "1":
        raise RuntimeError(f"EMOREWARD_REQUIRE_VLLM=1 but vLLM's interpreter {VLLM_PYTHON} does not exist")
    pytest.skip(f"no vLLM environment at {VLLM_PYTHON} (make install-vllm)", allow_module_level=True)

DESCRIPTIONS = [
    "She smiles broadly; her voice rises: happy.",
    "  He is calm.\nThen he frowns, ANGRY!  ",
    "Sad, eyes lowered, très triste.",
    "",
    "The woman looks happy and smiles while talking. " * 40,  # cut to max_length: flagged, same reward
]
SUBTITLES = ["I got the job!", None, "Leave me alone.", "Fine.", "Really?"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, path: str, payload: dict) -> dict:
    parts = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(parts[0], int(parts[1]), timeout=120)
    conn.request("POST", path, json.dumps(payload), {"Content-Type": "application/json"})
    response = conn.getresponse()
    body = json.loads(response.read())
    conn.close()
    assert response.status == 200, body
    return body


# ---------------------------------------------------------------------------------------------- exports and servers
@pytest.fixture(scope="module")
def minilm_export(tmp_path_factory) -> Path:
    """The default recipe's model (MiniLM + LoRA on query / value) with a non-zero adapter and head, exported."""
    from peft import LoraConfig

    from emoreward.models import TextRewardModel

    torch.manual_seed(0)
    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["query", "value"], modules_to_save=None)
    model = TextRewardModel.from_backbone(str(minilm_dir()), max_length=64, lora_config=lora)
    with torch.no_grad():
        for name, p in model.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
            if "classifier" in name and name.endswith("weight"):
                p.normal_(0, 1.0)
    base = tmp_path_factory.mktemp("minilm")
    trained = model.save_pretrained(base / "trained")
    out = base / "export"
    export_hf(trained, out)
    return out


@pytest.fixture(scope="module")
def chat_export(tmp_path_factory) -> Path:
    """A 2-layer Llama reward model (head size 32, which vLLM's CPU attention takes) on a ChatML tokenizer."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from emoreward.models import TextRewardModel, TextSettings

    tok = bpe_chat.qwen_like_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        num_labels=1,
        pad_token_id=tok.pad_token_id,
        initializer_range=0.2,
    )
    torch.manual_seed(0)
    settings = TextSettings(backbone="tiny-llama", input_format="chat", instruction="Rate it.", max_length=96)
    model = TextRewardModel(LlamaForSequenceClassification(config).eval(), tok, settings)
    out = tmp_path_factory.mktemp("chat-export") / "export"
    export_hf(model, out)
    return out


@pytest.fixture(scope="module")
def minilm_server(minilm_export, tmp_path_factory):
    log = tmp_path_factory.mktemp("logs") / "vllm-minilm.log"
    with VllmServer(minilm_export, python=VLLM_PYTHON, port=free_port(), log=log, start_timeout=400) as server:
        yield server


@pytest.fixture(scope="module")
def chat_server(chat_export, tmp_path_factory):
    log = tmp_path_factory.mktemp("logs") / "vllm-chat.log"
    with VllmServer(chat_export, python=VLLM_PYTHON, port=free_port(), log=log, start_timeout=400) as server:
        yield server


def reference(export: Path):
    return load_reward_model(export, dtype="float32")


# ---------------------------------------------------------------------------------------------- rewards
@pytest.mark.parametrize("which", ["minilm", "chat"])
def test_classify_rewards_equal_the_in_process_model(which, request):
    export = request.getfixturevalue(f"{which}_export")
    server = request.getfixturevalue(f"{which}_server")
    remote = VllmRewardModel(export, server.url)
    contexts = [RewardContext(subtitle=s) for s in SUBTITLES]
    got, want = remote.score_info(DESCRIPTIONS, contexts), reference(export).score_info(DESCRIPTIONS, contexts)
    assert len(set(np.round(want.rewards, 4))) == len(DESCRIPTIONS)  # the items differ
    assert_same_rewards(got.rewards, want.rewards, "float32")
    assert got.truncated.tolist() == want.truncated.tolist() == [False, False, False, False, True]
    assert got.n_tokens.tolist() == want.n_tokens.tolist()
    assert remote.precision_name == "float32" and remote.score([]).shape == (0,)
    # one context for all, and shuffled inputs: the same reward per input
    order = [3, 0, 4, 2, 1]
    shuffled = remote.score([DESCRIPTIONS[i] for i in order], [contexts[i] for i in order])
    assert_same_rewards(shuffled, got.rewards[order], "float32")


def test_a_request_built_from_the_export_alone_gets_the_same_rewards(minilm_export, chat_export, request):
    """What a newcomer writes from the model card and docs/serving.md, with transformers alone."""
    from transformers import AutoTokenizer

    minilm = request.getfixturevalue("minilm_server")
    tok = AutoTokenizer.from_pretrained(minilm_export)
    ids = [
        tok(f"Subtitle: {s}", d)["input_ids"] if s else tok(d)["input_ids"]
        for d, s in zip(DESCRIPTIONS[:3], SUBTITLES)
    ]
    body = {"model": served_name(minilm_export), "input": ids, "use_activation": False}
    rewards = [d["probs"][0] for d in post(minilm.url, "/classify", body)["data"]]
    want = reference(minilm_export).score(DESCRIPTIONS[:3], SUBTITLES[:3])
    assert_same_rewards(rewards, want, "float32")

    chat = request.getfixturevalue("chat_server")
    rewards = []
    for d, s in zip(DESCRIPTIONS[:3], SUBTITLES):
        user = "Rate it." + (f"\nSubtitle: {s}" if s else "")
        messages = [{"role": "user", "content": user}, {"role": "assistant", "content": d}]
        body = {"model": served_name(chat_export), "messages": messages, "use_activation": False}
        rewards.append(post(chat.url, "/classify", body)["data"][0]["probs"][0])
    want = reference(chat_export).score(DESCRIPTIONS[:3], SUBTITLES[:3])
    assert_same_rewards(rewards, want, "float32")


def test_a_server_serving_another_export_is_refused(minilm_export, chat_export, minilm_server, tmp_path):
    with pytest.raises(
        ValueError, match=r"serves \['emoreward-[0-9a-f]{16}-float32'\], not the export .*--served-model-name"
    ):
        VllmRewardModel(chat_export, minilm_server.url)
    changed = tmp_path / "changed"  # the same folder with one file changed: another content, refused
    shutil.copytree(minilm_export, changed)
    (changed / "README.md").write_text((changed / "README.md").read_text() + "\nedited\n")
    with pytest.raises(ValueError, match="content fingerprint"):
        VllmRewardModel(changed, minilm_server.url)
    with pytest.raises(ValueError, match="not an export"):
        VllmRewardModel(minilm_export.parent / "trained", minilm_server.url)


# ---------------------------------------------------------------------------------------------- commands
def test_rank_through_vllm_equals_the_in_process_ranking(minilm_export, minilm_server, tmp_path, monkeypatch):
    """`emoreward rank` on the bundled OV-MERD table (12 samples x 10 models): the same report through vLLM, and
    its score cache is keyed by the export's content and the served dtype: the in-process float32 rerun on it
    scores nothing."""
    from emoreward.cli.main import main

    monkeypatch.setenv("EMOREWARD_DTYPE", "float32")  # the in-process route in the server's precision
    table = ROOT / "emoreward" / "data" / "files" / "ovmerd" / "ovmerd_descriptions_subtitle.jsonl"
    common = ["rank", "--judge", str(minilm_export), "--data", str(table), "--samples", "12", "--seed", "3"]
    common += ["--n-boot", "20", "--quiet"]
    runs = {}
    for name, extra in (("vllm", ["--vllm-url", minilm_server.url]), ("local", [])):
        out = tmp_path / f"{name}.json"
        assert main([*common, *extra, "--cache-dir", str(tmp_path / name), "--output", str(out)]) == 0
        runs[name] = json.loads(out.read_text())
    assert runs["vllm"]["cost"]["n_scored"] == runs["local"]["cost"]["n_scored"] == 120
    vllm_cache, local_cache = (
        {r["key"]: r["score"] for r in map(json.loads, next((tmp_path / n).glob("*.jsonl")).read_text().splitlines())}
        for n in ("vllm", "local")
    )
    assert vllm_cache.keys() == local_cache.keys() and len(vllm_cache) == 120
    keys = sorted(vllm_cache)
    assert_same_rewards([vllm_cache[k] for k in keys], [local_cache[k] for k in keys], "float32")
    assert runs["vllm"]["ranking"] == runs["local"]["ranking"] and len(runs["vllm"]["ranking"]) == 10
    rerun = tmp_path / "rerun.json"
    assert main([*common, "--cache-dir", str(tmp_path / "vllm"), "--output", str(rerun)]) == 0
    assert json.loads(rerun.read_text())["cost"]["n_scored"] == 0


def test_evaluate_through_vllm_equals_in_process(chat_export, chat_server, tmp_path, monkeypatch):
    from emoreward.cli.main import main

    monkeypatch.setenv("EMOREWARD_DTYPE", "float32")  # the in-process route in the server's precision
    pairs = tmp_path / "pairs.jsonl"
    rows = [
        {"sample_id": f"s{k}", "description_1": a, "description_2": b, "label": lab, "subtitle": sub}
        for k, (a, b, lab, sub) in enumerate(
            [
                (DESCRIPTIONS[0], DESCRIPTIONS[2], "1", "I got the job!"),
                (DESCRIPTIONS[1], "Calm.", "2", "Fine."),
                (DESCRIPTIONS[2], DESCRIPTIONS[4], "1", "Really?"),
                (DESCRIPTIONS[4], DESCRIPTIONS[0], "2", "Leave me alone."),
            ]
        )
    ]
    pairs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    reports = {}
    for name, extra in (("vllm", ["--vllm-url", chat_server.url]), ("local", ["--dtype", "float32"])):
        out = tmp_path / f"{name}.json"
        assert main(["evaluate", "--model", str(chat_export), "--data", str(pairs), "--output", str(out), *extra]) == 0
        reports[name] = json.loads(out.read_text())
    got, want = reports["vllm"]["judge"], reports["local"]["judge"]
    assert got["three_class"] == want["three_class"] and got["two_class"] == want["two_class"]
    assert want["three_class"]["confusion"]  # the metrics were computed


# ---------------------------------------------------------------------------------------------- RL adapters
def test_verl_pointed_at_vllm_equals_pointed_at_emoreward_serve(minilm_export, minilm_server):
    import emoreward.export.verl as verl
    from emoreward.export.serve.http import RewardServer
    from emoreward.export.serve.service import RewardService

    infos = [{"subtitle": s, "sample_id": f"s{k}"} for k, s in enumerate(SUBTITLES)]
    common = {"solution_strs": DESCRIPTIONS, "ground_truths": [None] * 5, "extra_infos": infos}
    through_vllm = verl.compute_score_batch(**common, model=str(minilm_export), vllm_url=minilm_server.url)
    single = verl.compute_score(
        solution_str=DESCRIPTIONS[0], extra_info=infos[0], model=str(minilm_export), vllm_url=minilm_server.url
    )
    with RewardServer(RewardService(reference(minilm_export)), port=0) as srv:
        through_serve = verl.compute_score_batch(**common, server_url=f"http://127.0.0.1:{srv.port}")
    verl.close_pools()
    got, want = (np.array([r["score"] for r in rs]) for rs in (through_vllm, through_serve))
    assert_same_rewards(got, want, "float32")
    assert [r["truncated"] for r in through_vllm] == [r["truncated"] for r in through_serve] == [0, 0, 0, 0, 1]
    assert_same_rewards([single["score"]], want[:1], "float32")
    with pytest.raises(ValueError, match="'vllm_url' needs 'model'"):
        verl.compute_score(solution_str="x", vllm_url=minilm_server.url, server_url="http://127.0.0.1:1")


def test_openrlhf_reward_file_pointed_at_vllm_equals_get_reward(chat_export, chat_server, monkeypatch):
    """OpenRLHF executes the file as a module and calls it per sample from threads, all at once."""
    from emoreward.export.serve import reward_func as reward_file
    from emoreward.export.serve.http import RewardServer
    from emoreward.export.serve.service import RewardService

    monkeypatch.setenv("EMOREWARD_RM_MODEL", str(chat_export))
    monkeypatch.setenv("EMOREWARD_RM_LABELS", "subtitle")
    monkeypatch.setenv("EMOREWARD_RM_VLLM_URL", chat_server.url)
    spec = importlib.util.spec_from_file_location("reward_func", reward_file.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    prompt = "<|im_start|>user\nDescribe the emotional state of the person.<|im_end|>\n<|im_start|>assistant\n"
    queries = [prompt + d + "<|im_end|>" for d in DESCRIPTIONS[:4]]  # (the server refuses the over-long one)
    labels = [s or "" for s in SUBTITLES[:4]]

    async def rollout():
        return await asyncio.gather(
            *(asyncio.to_thread(module.reward_func, [q], [prompt], [s]) for q, s in zip(queries, labels))
        )

    got = np.array([float(info["rewards"][0]) for info in asyncio.run(rollout())])
    service = RewardService(reference(chat_export), openrlhf_labels="subtitle")
    with RewardServer(service, port=0) as srv:
        body = {"query": queries, "prompts": [prompt] * 4, "labels": labels}
        want = np.array(post(f"http://127.0.0.1:{srv.port}", "/get_reward", body)["rewards"])
    assert_same_rewards(got, want, "float32")


def test_grpo_reward_pointed_at_vllm_equals_the_loaded_model(chat_export, chat_server):
    from emoreward.export.grpo import EmotionReward

    prompts = [
        [{"role": "user", "content": f"Describe it.\nSubtitle: {s}"}] if s else "Describe it." for s in SUBTITLES
    ]
    completions = [[{"role": "assistant", "content": d}] for d in DESCRIPTIONS]
    remote = EmotionReward(str(chat_export), vllm_url=chat_server.url, length_monitor=False)
    local = EmotionReward(reference(chat_export), length_monitor=False)
    assert_same_rewards(remote(prompts, completions), local(prompts, completions), "float32")
    with pytest.raises(ValueError, match="vllm_url needs the export folder"):
        EmotionReward(reference(chat_export), vllm_url=chat_server.url)


def test_the_server_module_prints_the_serve_line(chat_export, tmp_path):
    """`python -m emoreward.export.vllm EXPORT` prints the served name and the command docs/serving.md shows."""
    export = tmp_path / "export"
    shutil.copytree(chat_export, export)
    done = subprocess.run(
        [sys.executable, "-m", "emoreward.export.vllm", str(export), "--port", "8001"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    line = json.loads(done.stdout)
    assert line["served_model_name"] == served_name(export)
    template = tmp_path / "export.vllm_chat_template.jinja"
    assert line["command"][:3] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
    assert "--chat-template" in line["command"] and template.is_file()


# ---------------------------------------------------------------------------------------------- multimodal exports
MEDIA_DESCRIPTIONS = ["She beams, her voice lifting with delight.", "sad", "  Flat and tired, he mumbles.", "Calm."]


@pytest.fixture(scope="module")
def media_export(tmp_path_factory):
    """kind -> (export folder, media root, context): a tiny random-weight model of the backbone (head size 32, which
    vLLM's CPU attention takes) with a non-zero LoRA adapter, trained-folder-saved and exported with `emoreward
    export` (the engine layout and its request data); Qwen2.5-VL reads a 1.5 s clip, Omni the clip and a WAV."""
    sys.path.insert(0, str(ROOT / "tests" / "multimodal"))
    from peft import LoraConfig
    from tiny_media import VLLM_TEXT, build_tiny, write_video, write_wav

    from emoreward.cli.main import main
    from emoreward.data.media import MediaOptions
    from emoreward.models.media.model import MediaRewardModel

    cache = {}

    def make(kind: str):
        if kind in cache:
            return cache[kind]
        root = tmp_path_factory.mktemp(f"vllm-{kind}")
        base = build_tiny(kind, root / "base", text=VLLM_TEXT)
        media = root / "media"
        write_video(media / "video" / "clip.mp4", seconds=1.5, seed=3)
        context = {"subtitle": "I can't believe it.", "sample_id": "clip", "video": "video/clip.mp4"}
        if kind != "qwen2.5-vl":
            write_wav(media / "audio" / "clip.wav", seconds=1.5)
            context["audio"] = "audio/clip.wav"
        if kind == "qwen2-audio":
            context.pop("video")
        torch.manual_seed(0)
        lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=None)
        options = MediaOptions(str(media), fps=4.0, max_frames=8)
        model = MediaRewardModel.from_backbone(
            kind, str(base), lora_config=lora, media_options=options, max_length=1024
        )
        torch.manual_seed(1)
        with torch.no_grad():
            for name, p in model.model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.3)
        model.save_pretrained(root / "original")
        assert main(["export", "--model", str(root / "original"), "--output", str(root / "export")]) == 0
        cache[kind] = (root / "export", media, context)
        return cache[kind]

    return make


@pytest.mark.parametrize("kind", ["qwen2.5-vl", "qwen2.5-omni-thinker", "qwen2-audio"])
def test_a_multimodal_export_served_by_vllm_gives_the_same_rewards(kind, media_export, tmp_path):
    """(c) Qwen2.5-VL with a video clip, (d) Omni with the clip and its WAV, and Qwen2-Audio with the WAV: the
    requests built from the export's `emoreward_request.json` (the frames sampled by the model's rule, the audio as
    its own part) give the rewards of `load_reward_model(export).score`."""
    export, media, context = media_export(kind)
    want = load_reward_model(export, media_root=str(media), dtype="float32").score(
        MEDIA_DESCRIPTIONS, RewardContext(**context)
    )
    assert np.ptp(want) > 1e-3  # the descriptions differ: the comparison can fail
    with VllmServer(export, python=VLLM_PYTHON, port=free_port(), log=tmp_path / "vllm.log", start_timeout=500) as srv:
        remote = VllmRewardModel(export, srv.url, media_root=str(media))
        info = remote.score_info(MEDIA_DESCRIPTIONS, RewardContext(**context))
    assert_same_rewards(info.rewards, want, "float32")
    assert remote.kind == "media" and not info.truncated.any() and (info.n_tokens > 0).all()
