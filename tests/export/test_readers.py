"""How RL stacks read an exported text reward model, each reimplemented exactly as its source does it (OpenRLHF
and verl are not installed): equal rewards where the export's model card says a reader works, different rewards where
it warns. And the exported tokenizer loads in transformers 4.x-compatible form.

Readers, as read from their sources:

- TRL / transformers: `AutoModelForSequenceClassification`, `logits[:, 0]`.
- OpenRLHF (github.com/OpenRLHF/OpenRLHF, `openrlhf/models/model.py::_get_reward_model`, used by
  `get_llm_for_sequence_regression(path, "reward")` and `openrlhf/cli/serve_rm.py`): the checkpoint's base model
  (`AutoModel`'s class, under its `base_model_prefix`) plus a value head `score = Linear(hidden, 1, bias=False)`,
  position ids `cumsum(mask) - 1`, the value read at the last attended position; the server pads on the LEFT.
- verl (github.com/volcengine/verl, `verl/workers/fsdp_workers.py::RewardModelWorker`): `AutoModelForTokenClassification`
  with `num_labels = 1` and `classifier_dropout = 0`, logits read at `argmax(position_ids * attention_mask)`.
"""

import json

import bpe_chat
import numpy as np
import pytest
import torch
from _helpers import assert_same_rewards
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    AutoTokenizer,
    PreTrainedTokenizerFast,
    pipeline,
)

from emoreward.export.hf import export_hf
from emoreward.models import TextRewardModel, TextSettings
from emoreward.models.base import load_settings
from emoreward.models.text import text_input_ids


PROBES = [
    "She laughs and her voice brightens: clearly happy.",
    "He sighs, looks down; sad and tired.",
    "Neutral.",
    "  He is calm.\nThen he frowns, ANGRY!  ",
]
SUBTITLES = ["I did it!", None, "okay", None]


# ---------------------------------------------------------------------------------------------- the readers
def openrlhf_reward_model(path):
    """OpenRLHF's reward model class for the checkpoint at `path` (non-packing path of `_get_reward_model`,
    `normalize_reward` off), loaded the way `get_llm_for_sequence_regression` loads it."""
    config = AutoConfig.from_pretrained(path)
    base_class = AutoModel._model_mapping[type(config)]
    base_pretrained_class = base_class.__base__

    class RewardModel(base_pretrained_class):
        def __init__(self, config):
            super().__init__(config)
            setattr(self, self.base_model_prefix, base_class(config))
            self.value_head_prefix = "score"
            setattr(self, self.value_head_prefix, torch.nn.Linear(config.hidden_size, 1, bias=False))
            self.post_init()

        def forward(self, input_ids, attention_mask):
            eos_indices = attention_mask.size(1) - 1 - attention_mask.long().fliplr().argmax(dim=1, keepdim=True)
            position_ids = attention_mask.long().cumsum(-1) - 1
            position_ids.masked_fill_(attention_mask == 0, 1)
            outputs = getattr(self, self.base_model_prefix)(
                input_ids, attention_mask=attention_mask, position_ids=position_ids
            )
            values = getattr(self, self.value_head_prefix)(outputs["last_hidden_state"]).squeeze(-1)
            return values.gather(dim=1, index=eos_indices).squeeze(1)

    torch.manual_seed(123)  # a value head missing from the checkpoint is initialised at random
    return RewardModel.from_pretrained(path, config=config, dtype=torch.float32).eval()


def verl_reward_module(path):
    """verl's `RewardModelWorker._build_model`: token classification, one label, no classifier dropout."""
    config = AutoConfig.from_pretrained(path)
    config.num_labels = 1
    config.classifier_dropout = 0.0
    torch.manual_seed(123)
    return AutoModelForTokenClassification.from_pretrained(path, config=config, dtype=torch.float32).eval()


def pad(sequences, pad_id, side):
    width = max(map(len, sequences))
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        span = slice(width - len(seq), width) if side == "left" else slice(0, len(seq))
        ids[row, span], mask[row, span] = torch.tensor(seq), 1
    return ids, mask


@torch.no_grad()
def read_sequence_classification(model, sequences, pad_id, side, position_ids=True, token_type_ids=None):
    ids, mask = pad(sequences, pad_id, side)
    kwargs = {"position_ids": (mask.cumsum(-1) - 1).clamp(min=0)} if position_ids else {}
    if token_type_ids is not None:
        kwargs["token_type_ids"] = token_type_ids
    return model(input_ids=ids, attention_mask=mask, **kwargs).logits[:, 0].numpy()


@torch.no_grad()
def read_openrlhf(model, sequences, pad_id):
    ids, mask = pad(sequences, pad_id, "left")  # serve_rm.py: get_tokenizer(..., "left")
    return model(ids, mask).numpy()


@torch.no_grad()
def read_verl(module, sequences, pad_id):
    ids, mask = pad(sequences, pad_id, "left")  # verl's prompts are left-padded
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)  # verl's compute_position_id_with_mask
    rm_score = module(input_ids=ids, attention_mask=mask, position_ids=position_ids, use_cache=False).logits
    rm_score = rm_score.squeeze(-1)
    eos_mask_idx = torch.argmax(position_ids * mask, dim=-1)
    return rm_score[torch.arange(len(sequences)), eos_mask_idx].numpy()


# ---------------------------------------------------------------------------------------------- exports
@pytest.fixture(scope="module")
def decoder_export(tmp_path_factory):
    """A tiny Llama reward model (chat layout, Qwen-like BPE tokenizer) exported with `export_hf`."""
    model = bpe_chat.tiny_chat_reward_model(bpe_chat.qwen_like_tokenizer(), max_length=128)
    path = tmp_path_factory.mktemp("decoder-export")
    export_hf(model, path, probes=PROBES, contexts=SUBTITLES)
    return model, path


@pytest.fixture(scope="module")
def encoder_export(tmp_path_factory, tiny_bert_dir):
    """A tiny BERT reward model (pair layout, MiniLM's WordPiece tokenizer) exported with `export_hf`; weights drawn
    wide (std 0.3) so that rewards differ clearly between descriptions, as a trained model's do."""
    from transformers import BertConfig, BertForSequenceClassification

    tokenizer = AutoTokenizer.from_pretrained(tiny_bert_dir)
    config = BertConfig.from_pretrained(tiny_bert_dir, initializer_range=0.3)
    torch.manual_seed(0)
    settings = TextSettings(backbone="tiny-bert", input_format="pair", max_length=128, instruction="Rate it.")
    model = TextRewardModel(BertForSequenceClassification(config).eval(), tokenizer, settings)
    path = tmp_path_factory.mktemp("encoder-export")
    export_hf(model, path, probes=PROBES, contexts=SUBTITLES)
    return model, path


def export_ids(path):
    tokenizer = AutoTokenizer.from_pretrained(path)
    settings = load_settings(path)
    return tokenizer, [text_input_ids(tokenizer, settings, d, s).input_ids for d, s in zip(PROBES, SUBTITLES)]


# ---------------------------------------------------------------------------------------------- decoder
def test_decoder_export_card_claims(decoder_export):
    model, path = decoder_export
    card = (path / "README.md").read_text()
    assert "right or left padding" in card and "OpenRLHF" in card and "verl" in card
    expected = model.score(PROBES, SUBTITLES)
    tokenizer, ids = export_ids(path)
    assert ids[0][-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")  # ends at the end-of-turn token
    seqcls = AutoModelForSequenceClassification.from_pretrained(path).eval()
    for side in ("right", "left"):
        got = read_sequence_classification(seqcls, ids, tokenizer.pad_token_id, side)
        assert_same_rewards(got, expected, "float32")
    # OpenRLHF: its value head `score` is the export's head; equal rewards
    got = read_openrlhf(openrlhf_reward_model(path), ids, tokenizer.pad_token_id)
    assert_same_rewards(got, expected, "float32")
    assert len(set(np.round(expected, 5))) == len(PROBES)  # distinct rewards: equality means something


def test_verl_reads_the_decoder_export_like_sequence_classification(decoder_export):
    """verl's token-classification head has a bias the export lacks: transformers initialises that missing bias to
    ZERO (4.x and 5.x `_init_weights`), so verl reads the same rewards."""
    model, path = decoder_export
    tokenizer, ids = export_ids(path)
    module = verl_reward_module(path)
    assert float(module.score.bias.detach().abs().max()) == 0.0
    got = read_verl(module, ids, tokenizer.pad_token_id)
    assert_same_rewards(got, model.score(PROBES, SUBTITLES), "float32")


def test_decoder_card_does_not_claim_a_random_verl_bias(decoder_export):
    card = (decoder_export[1] / "README.md").read_text()
    assert "initialised at random" not in card and "loads as zero" in card


def test_exported_tokenizer_loads_as_pretrained_tokenizer_fast(decoder_export, encoder_export):
    # classes transformers 4.x has (transformers 5 writes `TokenizersBackend` for a plain fast tokenizer)
    expected_class = {decoder_export[1]: "PreTrainedTokenizerFast", encoder_export[1]: "BertTokenizer"}
    for model, path in (decoder_export, encoder_export):
        config = json.loads((path / "tokenizer_config.json").read_text())
        assert config["tokenizer_class"] == expected_class[path]
        loaded = PreTrainedTokenizerFast.from_pretrained(path)
        text = "  He is calm.\nThen ANGRY!"
        assert (
            loaded(text, add_special_tokens=False)["input_ids"]
            == model.tokenizer(text, add_special_tokens=False)["input_ids"]
        )
    assert (
        decoder_export[0].tokenizer.chat_template
        == PreTrainedTokenizerFast.from_pretrained(decoder_export[1]).chat_template
    )


# ---------------------------------------------------------------------------------------------- encoder
def test_encoder_export_card_claims_and_warnings(encoder_export):
    model, path = encoder_export
    card = (path / "README.md").read_text()
    assert "pad on the RIGHT" in card and "token_type_ids" in card and "Not OpenRLHF or verl directly" in card
    expected = model.score(PROBES, SUBTITLES)
    tokenizer, ids = export_ids(path)
    seqcls = AutoModelForSequenceClassification.from_pretrained(path).eval()
    pad_id = tokenizer.pad_token_id
    assert np.min(np.abs(np.diff(np.sort(expected)))) > 1e-2  # distinct rewards: differences mean something
    # what the card says: right padding, no token_type_ids -> the same rewards
    right = read_sequence_classification(seqcls, ids, pad_id, "right", position_ids=False)
    assert_same_rewards(right, expected, "float32")
    # what it warns against, each a real difference
    left = read_sequence_classification(seqcls, ids, pad_id, "left", position_ids=False)
    assert np.max(np.abs(left - expected)) > 1e-3
    contexts = ["Rate it.\nSubtitle: " + s if s else "Rate it." for s in SUBTITLES]
    # the plain idiom: the tokenizer returns what the model reads (`model_input_names`), so model(**tokenizer(...))
    # and the text-classification pipeline (no sigmoid: `problem_type: regression`) give the reward
    plain = tokenizer(contexts, PROBES, padding=True, return_tensors="pt")
    assert sorted(plain) == ["attention_mask", "input_ids"] and plain["input_ids"].tolist()[0][: len(ids[0])] == ids[0]
    with torch.no_grad():
        idiom = seqcls(**plain).logits[:, 0].numpy()
    assert_same_rewards(idiom, expected, "float32")
    classify = pipeline("text-classification", model=seqcls, tokenizer=tokenizer)
    scores = [classify({"text": c, "text_pair": p})["score"] for c, p in zip(contexts, PROBES)]
    assert_same_rewards(np.array(scores), expected, "float32")
    typed = tokenizer(contexts, PROBES, padding=True, return_tensors="pt", return_token_type_ids=True)
    assert int(typed["token_type_ids"].max()) == 1  # what a BERT tokenizer returns by default: another reward
    with torch.no_grad():
        typed = seqcls(**typed).logits[:, 0].numpy()
    assert np.max(np.abs(typed - expected)) > 1e-3
    verl = read_verl(verl_reward_module(path), ids, pad_id)  # the last token, no pooler
    assert np.max(np.abs(verl - expected)) > 1e-3
    openrlhf = read_openrlhf(openrlhf_reward_model(path), ids, pad_id)  # no `score` head in a BERT export
    assert np.max(np.abs(openrlhf - expected)) > 1e-3
