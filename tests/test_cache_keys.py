"""The cache test matrix: for every cache of model outputs (rank's score cache, the processed-media prefix cache,
the zero-shot judge call cache), each setting that changes the output changes the key, and nothing else does."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from emoreward.models import RewardContext, TextRewardModel
from emoreward.models.media.cache import MediaPrefixCache
from emoreward.models.precision import cpu_kind, precision_identity
from emoreward.ranking.score_cache import ScoreCache, score_key
from emoreward.ranking.scoring import score_table
from emoreward.utils.cache_key import cache_key, content_fingerprint
from zero_shot.backends.base import ChatRequest, MediaInput, SamplingConfig
from zero_shot.backends.hf_common import weights_precision
from zero_shot.cache import call_input_hash, media_array_digest
from zero_shot.testing import ScriptedBackend


@pytest.fixture(scope="module")
def saved(tiny_bert_dir, tmp_path_factory):
    model = TextRewardModel.from_backbone(str(tiny_bert_dir), max_length=64)
    return model.save_pretrained(tmp_path_factory.mktemp("rm") / "model")


def test_cache_key_needs_every_part_and_a_resolved_precision(monkeypatch):
    for name in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS"):
        monkeypatch.delenv(name, raising=False)
    f32 = precision_identity("float32")
    parts = dict(purpose="score", model="m", precision=f32, length_limit=8, layout="l", context="c", prompt="p")
    assert cache_key(**parts) == cache_key(**parts)
    for name in ("model", "length_limit", "layout", "context", "prompt", "purpose"):
        assert cache_key(**{**parts, name: "other" if name != "length_limit" else 9}) != cache_key(**parts), name
    assert cache_key(**{**parts, "precision": precision_identity("bfloat16")}) != cache_key(**parts)
    assert cache_key(**parts, extra={"t": 1.0}) != cache_key(**parts)
    with pytest.raises(TypeError):
        cache_key(purpose="score", model="m", precision=f32, layout="l", context="c", prompt="p")
    # the precision part is `precision_identity`'s record only: a bare dtype leaves the kernels out
    with pytest.raises(TypeError, match="precision_identity"):
        cache_key(**{**parts, "precision": "float32"})
    with pytest.raises(ValueError, match='"auto" names no precision'):
        precision_identity("auto")
    # the kernels: the CPU kind (`cpu_kind`, capped by the kernel selection) and MKL's cap; an unnamed cap (ALL)
    # leaves the kind, and so the key, as it is; a model on an accelerator is keyed by its device
    assert f32 == {"dtype": "float32", "kernels": f"cpu:{cpu_kind()}"}
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "ALL")
    assert precision_identity("float32") == f32
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    assert precision_identity("bfloat16")["kernels"] == "cpu:default"
    monkeypatch.delenv("ATEN_CPU_CAPABILITY")
    monkeypatch.setenv("MKL_ENABLE_INSTRUCTIONS", "avx2")
    assert precision_identity("float32")["kernels"] == f"cpu:{cpu_kind()}+mkl:AVX2"
    assert precision_identity(torch.float32, device=torch.device("cpu"))["kernels"] == f"cpu:{cpu_kind()}+mkl:AVX2"
    assert precision_identity(torch.bfloat16, device=torch.device("xpu")) == {"dtype": "bfloat16", "kernels": "xpu:"}
    assert precision_identity("float32", machine="cpu:amx") == {"dtype": "float32", "kernels": "cpu:amx"}
    assert precision_identity(None) is None


def test_score_key_matrix(saved, tmp_path):
    """The score cache: model content, precision, length limit, input layout, context and description each change
    the key; the tie threshold (not part of a score) and a reload of the same folder do not."""
    base = TextRewardModel.from_pretrained(saved, dtype="float32")
    context = RewardContext("oh")
    key = score_key(base, "She smiles.", context)
    assert score_key(TextRewardModel.from_pretrained(saved, dtype="float32"), "She smiles.", context) == key
    changed = {
        "description": score_key(base, "She frowns.", context),
        "subtitle": score_key(base, "She smiles.", RewardContext("ah")),
        "no subtitle": score_key(base, "She smiles.", RewardContext()),
        "precision": score_key(TextRewardModel.from_pretrained(saved, dtype="bfloat16"), "She smiles.", context),
    }
    for field, value in {"max_length": 32, "instruction": "Rate it.", "input_format": "chat"}.items():
        other = TextRewardModel.from_pretrained(saved, dtype="float32")
        other.settings = dataclasses.replace(other.settings, **{field: value})
        changed[field] = score_key(other, "She smiles.", context)
    trained = TextRewardModel.from_pretrained(saved, dtype="float32")
    with torch.no_grad():
        next(p for n, p in trained.model.named_parameters() if "classifier" in n).add_(0.5)  # a training step
    changed["weights in memory"] = score_key(trained, "She smiles.", context)
    retrained = trained.save_pretrained(tmp_path / "retrained")
    assert content_fingerprint(retrained) != content_fingerprint(saved)
    changed["saved content"] = score_key(
        TextRewardModel.from_pretrained(retrained, dtype="float32"), "She smiles.", context
    )
    for name, other in changed.items():
        assert other != key, name
    assert len(set(changed.values())) == len(changed)
    same = TextRewardModel.from_pretrained(saved, dtype="float32")
    same.settings = dataclasses.replace(same.settings, tie_threshold=0.5)
    assert score_key(same, "She smiles.", context) == key


def test_score_cache_never_serves_a_score_of_another_precision(saved, tmp_path):
    """A cache filled in bf16 is not read by the same model scoring in float32: each precision gets its own scores
    (today's main read the bf16 scores back for a float32 run)."""
    from emoreward.data.tables import DescriptionTable

    table = DescriptionTable.from_rows(
        [
            {"sample": "s1", "model": "a", "description": "She smiles warmly."},
            {"sample": "s1", "model": "b", "description": "Sad."},
        ]
    )
    cache = ScoreCache(tmp_path / "scores.jsonl")
    half = score_table(TextRewardModel.from_pretrained(saved, dtype="bfloat16"), table, cache)
    full = score_table(TextRewardModel.from_pretrained(saved, dtype="float32"), table, cache)
    assert half.n_scored == 2 and full.n_scored == 2 and full.n_cached == 0
    text = {"a": "She smiles warmly.", "b": "Sad."}
    exact = TextRewardModel.from_pretrained(saved, dtype="float32").score([text[m] for m in table.models])
    np.testing.assert_allclose(full.scores[:, 0], exact, atol=1e-6, rtol=0)
    again = score_table(TextRewardModel.from_pretrained(saved, dtype="bfloat16"), table, ScoreCache(cache.path))
    assert again.n_cached == 2 and np.array_equal(again.scores, half.scores)


def test_media_prefix_key_matrix(tmp_path):
    """The processed-media cache: the files' content, the processing settings and the subtitle each change the key;
    the file's name and modification time alone do not (the key is the content)."""
    video = tmp_path / "a.mp4"
    video.write_bytes(b"clip one")
    key = MediaPrefixCache.key([video, None], "settings", "oh")
    copy = tmp_path / "b.mp4"
    copy.write_bytes(b"clip one")
    assert MediaPrefixCache.key([copy, None], "settings", "oh") == key
    other = tmp_path / "c.mp4"
    other.write_bytes(b"clip two")
    audio = tmp_path / "a.wav"
    audio.write_bytes(b"tone")
    changed = {
        "content": MediaPrefixCache.key([other, None], "settings", "oh"),
        "audio": MediaPrefixCache.key([video, audio], "settings", "oh"),
        "settings": MediaPrefixCache.key([video, None], "settings, 2 fps", "oh"),
        "subtitle": MediaPrefixCache.key([video, None], "settings", "ah"),
        "no subtitle": MediaPrefixCache.key([video, None], "settings", None),
    }
    assert all(v != key for v in changed.values()) and len(set(changed.values())) == len(changed)


def test_judge_call_hash_matrix(tiny_bert_dir, tmp_path):
    """The judge call cache: backend identity, the precision its weights compute in, the answer budget, the
    prompt template, the prompt, the media content (also of in-memory arrays that differ only inside) and the
    sampling each change the input hash."""
    from transformers import BertForSequenceClassification

    request = ChatRequest(prompt="Which is better?", system="You judge.")
    sampling = SamplingConfig()

    def h(backend=None, request=request, sampling=sampling, tag="v1", media=None):
        return call_input_hash(
            backend=backend or ScriptedBackend("judge-a"),
            step="compare",
            system=request.system,
            prompt=request.prompt,
            media=media,
            sampling=sampling.as_dict(),
            score_labels=None,
            answer_prefix=None,
            prompts_tag=tag,
        )

    key = h()
    assert h() == key
    local = {}
    for dtype in (torch.float32, torch.bfloat16):
        weights = BertForSequenceClassification.from_pretrained(tiny_bert_dir, dtype=dtype)
        local[dtype] = h(ScriptedBackend("judge-a", precision=weights_precision(weights)))
    changed = {
        "identity": h(ScriptedBackend("judge-b")),
        "float32 weights": local[torch.float32],
        "bf16 weights": local[torch.bfloat16],
        "max_new_tokens": h(sampling=SamplingConfig(max_new_tokens=8)),
        "temperature": h(sampling=SamplingConfig(do_sample=True, temperature=0.5)),
        "template": h(tag="v2"),
        "prompt": h(request=ChatRequest(prompt="Which one?", system="You judge.")),
        "system": h(request=ChatRequest(prompt="Which is better?", system="Judge.")),
        "media": h(media=[("a.mp4", "digest-1"), (None, None)]),
    }
    assert all(v != key for v in changed.values()) and len(set(changed.values())) == len(changed)

    frames = np.zeros((4, 64, 64, 3), np.uint8)
    inside = frames.copy()
    inside[2, 30, 30, 1] = 7  # numpy's repr of both arrays is the same
    assert repr(frames) == repr(inside) and media_array_digest(frames) != media_array_digest(inside)
    assert MediaInput(frames=frames).frames is frames


def test_a_folder_edited_anywhere_in_place_has_new_content(tmp_path):
    """An edit in the middle of a large weight file, same size, name and modification time (restored), is a change
    for the folder's fingerprint and for the fingerprint of a model kept loaded for that path (verl's local scorer,
    the OpenRLHF reward file's server)."""
    import os

    from emoreward.utils.cache_key import current_fingerprint, source_fingerprint

    folder = tmp_path / "model"
    folder.mkdir()
    weights = folder / "adapter_model.safetensors"
    weights.write_bytes(bytes(range(256)) * (12 << 12))  # 12 MiB
    before, kept = content_fingerprint(folder), current_fingerprint(folder)
    assert before == kept == source_fingerprint(folder)
    stat = weights.stat()
    with weights.open("r+b") as fh:
        fh.seek(6 << 20)
        fh.write(b"\xff\xfe")
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the modification time set back
    assert weights.stat().st_size == stat.st_size and weights.stat().st_mtime_ns == stat.st_mtime_ns
    assert content_fingerprint(folder) != before
    assert current_fingerprint(folder) == content_fingerprint(folder)
