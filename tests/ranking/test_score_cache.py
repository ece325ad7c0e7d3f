"""The score cache keeps finished work: `rank` appends each scored chunk as it is done, also when every
description shares one context (a text model on a table without subtitles), and a rerun after a kill reuses the
finished scores unchanged and scores only the rest."""

import json

import numpy as np
import pytest

from emoreward.data.tables import bundled_ovmerd_path, load_description_table
from emoreward.models import load_reward_model
from emoreward.models.scoring import score_in_chunks
from emoreward.ranking.rank import rank_with_reward_model
from emoreward.ranking.score_cache import ScoreCache
from emoreward.ranking.scoring import score_table, table_context


class Interrupted(KeyboardInterrupt):
    """What a Ctrl-C (or a kill) does to the scoring loop: it stops between two chunks at the latest."""


def cache_lines(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_a_killed_ranking_keeps_its_finished_chunks_and_the_rerun_reuses_them(tmp_path, tiny_rm_dir, monkeypatch):
    table = load_description_table(bundled_ovmerd_path())  # 3,320 descriptions, no subtitles: one shared context
    assert len({table_context(table, s).subtitle for s in table.samples}) == 1
    model = load_reward_model(tiny_rm_dir, dtype="float32")
    score_ids, calls = model.score_ids, []

    def killed_on_the_third_chunk(*args, **kwargs):  # the engine runs one `score_ids` per chunk
        calls.append(len(args[0]))
        if len(calls) == 3:
            raise Interrupted
        return score_ids(*args, **kwargs)

    path = tmp_path / "scores.jsonl"
    monkeypatch.setattr(model, "score_ids", killed_on_the_third_chunk)
    with pytest.raises(Interrupted):
        rank_with_reward_model(model, table, ScoreCache(path), n_boot=5)
    kept = cache_lines(path)
    assert len(kept) == calls[0] + calls[1] == 2 * 512  # two finished chunks on disk
    with path.open("a") as fh:
        fh.write('{"key": "torn by the kill", "sco')  # a line cut short by a kill mid-write
    monkeypatch.undo()

    rerun = rank_with_reward_model(model, table, ScoreCache(path), n_boot=5)
    distinct = len(ScoreCache(path))  # distinct (description, context) items of the table
    assert rerun.cost["n_scored"] == distinct - 2 * 512  # only the unfinished work is scored again
    assert rerun.cost["n_cached"] + rerun.cost["n_scored"] == distinct  # one unit: distinct descriptions
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    # every entry on its own line; the torn one kept where it was (another run may have appended after it), skipped
    assert len(lines) == distinct + 1 and lines[2 * 512] == '{"key": "torn by the kill", "sco'
    assert ScoreCache(path).n_skipped == 1

    fresh = score_table(model, table, ScoreCache(tmp_path / "fresh.jsonl"))
    again = score_table(model, table, ScoreCache(path))
    assert again.n_scored == 0 and again.n_cached == len(ScoreCache(path))
    reused = {entry["key"]: entry["score"] for entry in kept}
    cache = ScoreCache(path)
    assert all(cache.get(key) == value for key, value in reused.items())  # reused exactly, never rescored
    np.testing.assert_allclose(again.scores, fresh.scores, atol=1e-5)  # fp32: batch composition moves ~1e-6


def test_text_chunks_are_consecutive_slices_of_one_length_order(tiny_rm_dir):
    model = load_reward_model(tiny_rm_dir, dtype="float32")
    table = load_description_table(bundled_ovmerd_path()).subset(models=["Otter", "Video-LLaVA"])
    context = table_context(table, table.samples[0])
    texts = list(table.descriptions.values())
    chunks = list(score_in_chunks(model, texts, [context] * len(texts), chunk_size=100))
    assert [len(idx) for idx, _ in chunks] == [100] * 6 + [64]
    assert sorted(int(i) for idx, _ in chunks for i in idx) == list(range(len(texts)))  # each once
    lengths = [len(texts[i]) for idx, _ in chunks for i in idx]
    assert lengths == sorted(lengths)
    whole = model.score_info(texts, context)  # the same engine in one call: the same rewards
    for idx, info in chunks:
        # float32: a text's batch (its padded width) differs between the two plans by a few ulps of the reward
        np.testing.assert_allclose(info.rewards, whole.rewards[idx], atol=5e-6, rtol=0)
        np.testing.assert_array_equal(info.truncated, whole.truncated[idx])
    with pytest.raises(ValueError, match="chunk_size"):
        list(score_in_chunks(model, texts, [context] * len(texts), chunk_size=0))
