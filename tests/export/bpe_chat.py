"""A Qwen-like byte-level BPE tokenizer (ChatML template, eos `<|im_end|>`, pad `<|endoftext|>`; decode(encode(text))
== text, as for Qwen / Llama 3 policies) and a tiny Llama reward model on it, built in memory in about a second (no
hub). Used by the export tests (server layout, readers)."""

from __future__ import annotations


CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "She smiles broadly; her voice rises: happy.",
    "  He is calm.\nThen he frowns, ANGRY!  ",
    "Sad, eyes lowered, très triste.",
    "Describe the emotional state of the person.",
    "The woman looks happy and smiles while talking.",
    "He seems sad, with a trembling voice and lowered eyes.",
]


def qwen_like_tokenizer(vocab_size: int = 400):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 10, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", clean_up_tokenization_spaces=False
    )
    fast.chat_template = CHATML
    return fast


def tiny_chat_reward_model(tokenizer, max_length: int = 96, instruction: str = "Rate it.", seed: int = 0):
    """A `TextRewardModel` (chat layout) on a 2-layer Llama with a value head `score` (no bias)."""
    import torch
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from emoreward.models import TextRewardModel, TextSettings

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        num_labels=1,
        pad_token_id=tokenizer.pad_token_id,
        initializer_range=0.2,
    )
    torch.manual_seed(seed)
    settings = TextSettings(backbone="tiny-llama", input_format="chat", instruction=instruction, max_length=max_length)
    return TextRewardModel(LlamaForSequenceClassification(config).eval(), tokenizer, settings)
