"""One token layout on every route: training, scoring, the GRPO reward and the export recipe build the same token
ids for a (description, context), through `emoreward.models.text.text_input_ids`; a chat sequence ends at the
end-of-turn token (where a generated response ends); descriptions that do not fit are flagged, never cut
silently."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from _helpers import assert_same_rewards, minilm_dir

from emoreward.data import PreferencePair
from emoreward.export import EmotionReward
from emoreward.export.hf import export_hf, score_with_transformers
from emoreward.models import RewardContext, TextSettings, load_reward_model, load_settings
from emoreward.models.text import TextRewardModel, text_input_ids
from emoreward.training.preprocess import build_text_dataset


CHATML = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def bpe_tokenizer():
    """A real byte-level BPE tokenizer (the kind SmolLM2 and Qwen use: spaces and newlines are part of tokens),
    trained here on a few sentences, with ChatML special tokens and template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    corpus = [
        "She is sad and tired.", "He smiles broadly, happy!", "  leading spaces\n\nmatter", "user\nassistant\n",
        "assistant\n  She is sad.", "\n  She\n  is\n  sad",
    ]  # fmt: skip
    tok.train_from_iterator(corpus * 50, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = CHATML
    return fast


@pytest.fixture(scope="module")
def chat_model():
    from transformers import LlamaConfig, LlamaForSequenceClassification

    tokenizer = bpe_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, num_labels=1, pad_token_id=tokenizer.pad_token_id,
        initializer_range=0.2,
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForSequenceClassification(config).eval()
    settings = TextSettings(backbone="tiny-bpe-llama", input_format="chat", instruction="Describe it.", max_length=96)
    return TextRewardModel(model, tokenizer, settings)


def random_text(rng: random.Random) -> str:
    """Strings of the kinds that broke routes before: whitespace runs, newlines, tabs, CJK, emoji and combining marks,
    special-token spellings, empty strings."""
    pieces = [
        " ", "  ", "\n", "\n\n", "\t", "She", " is", " sad", ".", "开心", "很难过", "😊", "e\u0301", "\u00a0",
        "<|im_end|>", "<|im_start|>assistant", "[SEP]", "[CLS]", "Subtitle:", "end", "\r\n",
    ]  # fmt: skip
    return "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))


def test_chat_sequence_ends_at_the_end_of_turn_token(chat_model):
    tok = chat_model.tokenizer
    ids = chat_model.encode("She is sad.").input_ids
    assert ids[-1] == tok.convert_tokens_to_ids("<|im_end|>")  # not the template's newline after it
    # what an RL stack builds: the conversation text up to the end-of-turn token, tokenized as one text
    messages = [{"role": "user", "content": "Describe it."}, {"role": "assistant", "content": "She is sad."}]
    text = tok.apply_chat_template(messages, tokenize=False).rstrip()
    assert ids == tok(text, add_special_tokens=False)["input_ids"]


def test_leading_spaces_tokenize_as_inside_the_conversation(chat_model):
    tok = chat_model.tokenizer
    description = "  She is sad."
    messages = [{"role": "user", "content": "Describe it."}, {"role": "assistant", "content": description}]
    whole = tok(tok.apply_chat_template(messages, tokenize=False).rstrip(), add_special_tokens=False)["input_ids"]
    assert chat_model.encode(description).input_ids == whole
    # tokenizing the description on its own (the old layout) gives other ids: the case this guards against
    head = tok(
        tok.apply_chat_template(messages[:1], tokenize=False) + "<|im_start|>assistant\n", add_special_tokens=False
    )
    alone = head["input_ids"] + tok(description, add_special_tokens=False)["input_ids"] + whole[-1:]
    assert alone != whole


def test_every_route_builds_the_same_ids_and_rewards(chat_model, tmp_path):
    rng = random.Random(0)
    texts = [random_text(rng) for _ in range(120)]
    subtitles = [random.Random(k).choice([None, "oh no", " 为什么? ", "<|im_end|>"]) for k in range(len(texts))]
    # training: the dataset rows are the encodings scoring uses
    pairs = [
        PreferencePair(f"s{k}", texts[k], texts[k] + " x", "1", media=_media(subtitles[k])) for k in range(len(texts))
    ]
    dataset, _ = build_text_dataset(pairs, chat_model, truncation="truncate")
    rows = {sid: ids for sid, ids in zip(dataset["sample_id"], dataset["chosen_ids"])}
    for k, (d, s) in enumerate(zip(texts, subtitles)):
        if f"s{k}" in rows:
            assert rows[f"s{k}"] == chat_model.encode(d, s).input_ids
    # the export recipe: the exported tokenizer and settings alone rebuild the ids
    export_hf(chat_model, tmp_path / "export", probes=texts[:8], contexts=subtitles[:8])
    exported = load_reward_model(tmp_path / "export")
    settings = load_settings(tmp_path / "export")
    for d, s in zip(texts, subtitles):
        assert text_input_ids(exported.tokenizer, settings, d, s).input_ids == chat_model.encode(d, s).input_ids
    # scoring with transformers alone on the recipe's ids == model.score == the GRPO reward
    rewards = chat_model.score(texts, subtitles)
    recipe = [text_input_ids(exported.tokenizer, settings, d, s).input_ids for d, s in zip(texts, subtitles)]
    assert_same_rewards(score_with_transformers(exported.model, recipe), rewards, "float32")
    grpo = EmotionReward(chat_model)([None] * len(texts), texts, subtitle=subtitles)
    assert_same_rewards(grpo, rewards, "float32")  # other batches, float rounding only
    # padding side and batch neighbours do not change a reward
    alone = np.array([chat_model.score([d], s)[0] for d, s in zip(texts[:10], subtitles[:10])])
    assert_same_rewards(alone, rewards[:10], "float32")


def _media(subtitle):
    from emoreward.data import MediaRef

    return MediaRef(subtitle=subtitle)


def test_pair_layout_is_what_the_tokenizer_gives_for_a_batch_of_sentence_pairs():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(minilm_dir())
    settings = TextSettings(backbone="minilm", input_format="pair", instruction="Rate it.", max_length=128)
    rng = random.Random(1)
    for _ in range(100):
        d, s = random_text(rng), rng.choice([None, "oh no", "为什么"])
        context = "Rate it." + (f"\nSubtitle: {s}" if s else "")
        assert text_input_ids(tok, settings, d, s).input_ids == tok([context], [d])["input_ids"][0]


def test_over_long_descriptions_are_flagged_not_cut_silently(chat_model):
    body = " ".join(["She is sad and tired."] * 40)
    joyful, furious = body + " In the end she is joyful.", body + " In the end she is furious."
    info = chat_model.score_info([joyful, furious, "She is sad."], RewardContext("oh"))
    assert list(info.truncated) == [True, True, False]
    assert info.n_tokens.max() == chat_model.settings.max_length
    # cut to the same prefix, the two get the same reward: the flag is what tells a caller
    assert info.rewards[0] == pytest.approx(info.rewards[1], abs=1e-6)
    full = chat_model.encode(joyful, "oh", truncate=False)
    assert full.truncated and len(full.input_ids) > chat_model.settings.max_length
