"""CPU training's fast paths: the fused LoRA linear layer (float32: peft's results to rounding), float32 attention
and frozen modules held in bf16 during CPU bf16 training (the float32 weights come back; what is saved is float32),
and bf16 training reaching float32 training's verdicts on the bundled pairs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _helpers import synthetic_pairs


def lora_network(model_dir, targets=("query", "key", "value", "dense")):
    """A peft LoRA sequence classifier on `model_dir` with non-zero B (so the LoRA branch counts), eval mode."""
    from peft import LoraConfig

    from emoreward.models.text import TextRewardModel

    torch.manual_seed(0)
    lora = LoraConfig(task_type="SEQ_CLS", r=4, lora_alpha=8, target_modules=list(targets), init_lora_weights=False)
    model = TextRewardModel.from_backbone(str(model_dir), lora_config=lora, max_length=64)
    return model, model.model.eval()


def batch_of(model, texts):
    encoded = [model.encode(t).input_ids for t in texts]
    width = max(map(len, encoded))
    ids = torch.tensor([e + [model.tokenizer.pad_token_id] * (width - len(e)) for e in encoded])
    return {
        "input_ids": ids,
        "attention_mask": (torch.arange(width)[None] < torch.tensor([[len(e)] for e in encoded])),
    }


def logits_and_grads(network, inputs):
    network.zero_grad()
    out = network(**inputs).logits
    out.pow(2).sum().backward()
    return out.detach(), {n: p.grad.clone() for n, p in network.named_parameters() if p.requires_grad}


def test_fused_lora_linear_equals_peft_in_float32(tiny_bert_dir):
    """`LoraLinearFunction` computes peft's LoRA layer: the same rewards (1e-6) and gradients of every trainable
    parameter (1e-5 of its largest), for LoRA on every linear layer; peft's forward is back after the block."""
    from emoreward.training.fused_lora import fusable, fused_lora_linears

    model, network = lora_network(tiny_bert_dir)
    inputs = batch_of(model, ["She smiles.", "A long, flat and tired voice says nothing at all today."])
    layers = [m for m in network.modules() if fusable(m)]
    assert len(layers) == 2 * 6 + 1  # 2 layers x (q, k, v, attention out, intermediate, out) + the pooler
    reference, reference_grads = logits_and_grads(network, inputs)
    with fused_lora_linears(network):
        assert all("forward" in m.__dict__ for m in layers)
        fused, fused_grads = logits_and_grads(network, inputs)
    assert not any("forward" in m.__dict__ for m in layers)
    torch.testing.assert_close(fused, reference, atol=1e-6, rtol=0)
    assert reference_grads.keys() == fused_grads.keys()
    for name, grad in reference_grads.items():
        torch.testing.assert_close(fused_grads[name], grad, atol=1e-5 * float(grad.abs().max()), rtol=0, msg=name)


def test_sdpa_fp32_attention_is_sdpa_on_float32_copies():
    """bf16 q, k, v: the output is transformers' sdpa on their float32 copies, cast back to bf16, also inside
    autocast; float32 inputs go to sdpa unchanged."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from emoreward.training.cpu_bf16 import sdpa_fp32_attention

    module = torch.nn.Module()
    module.is_causal = False
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4).to(torch.bfloat16).requires_grad_() for _ in range(3))
    mask = torch.ones(2, 1, 5, 5, dtype=torch.bool)
    mask[0, ..., 3:] = False
    expected = sdpa_attention_forward(module, q.float(), k.float(), v.float(), mask)[0].to(torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = sdpa_fp32_attention(module, q, k, v, mask)
    assert out.dtype == torch.bfloat16 and torch.equal(out, expected)
    out.float().sum().backward()
    assert q.grad.dtype == torch.bfloat16 and q.grad.abs().sum() > 0
    q32 = q.detach().float()
    assert torch.equal(
        sdpa_fp32_attention(module, q32, q32, q32, mask)[0], sdpa_attention_forward(module, q32, q32, q32, mask)[0]
    )


def test_cpu_bf16_training_holds_frozen_modules_in_bf16_and_gives_float32_back(tiny_bert_dir):
    """Inside the block: every module without a trainable parameter in bf16, LoRA and the value head float32,
    attention switched to the float32 sdpa; after it: the very same float32 storage and values, and sdpa again."""
    from emoreward.training.cpu_bf16 import SDPA_FP32, cpu_bf16_training

    _, network = lora_network(tiny_bert_dir, targets=("query", "value"))
    before = {n: (p.data_ptr(), p.detach().clone()) for n, p in network.named_parameters()}
    frozen = {n for n, p in network.named_parameters() if not p.requires_grad}
    head = [n for n in frozen if "modules_to_save" in n]  # the value head's frozen bias stays with its weight
    assert network.config._attn_implementation == "sdpa"
    with cpu_bf16_training(network):
        dtypes = {n: p.dtype for n, p in network.named_parameters()}
        assert network.config._attn_implementation == SDPA_FP32
    assert head and all(dtypes[n] == torch.float32 for n in head)
    assert all(dtypes[n] == torch.bfloat16 for n in frozen - set(head))
    assert all(dtypes[n] == torch.float32 for n, p in network.named_parameters() if p.requires_grad)
    assert network.config._attn_implementation == "sdpa"
    for name, param in network.named_parameters():
        assert param.data_ptr() == before[name][0] and torch.equal(param.detach(), before[name][1]), name


def tiny_fit(model_dir, tmp_path, *, bf16: bool, pairs, save: bool = False, **extra):
    from emoreward.training.config import load_config
    from emoreward.training.pipeline import fit_reward_model

    config = load_config(
        overrides={
            "model_name_or_path": str(model_dir),
            "lora_r": 4,
            "lora_alpha": 8,
            "max_length": 128,
            "truncation": "truncate",
            "num_train_epochs": 1,
            "per_device_train_batch_size": 16,
            "gradient_accumulation_steps": 1,
            "learning_rate": 1e-2,
            "bf16": bf16,
            "pad_to_multiple_of": 16,
            "calibrate_tie_threshold": False,
            "report_to": ["none"],
            "disable_tqdm": True,
            "output_dir": str(tmp_path / ("bf16" if bf16 else "fp32")),
            **extra,
        }
    )
    fit = fit_reward_model(config, pairs, output_dir=config.output_dir, run_name="tiny", save=save)
    fit.model.scoring_dtype = "float32"  # both models scored alike
    return fit.model


def require_bf16_units():
    from emoreward.models.precision import has_bf16_matrix_units

    if not has_bf16_matrix_units("cpu"):
        pytest.skip("CPU bf16 training needs bf16 matrix units (bf16=true is refused here)")


def test_bf16_training_reaches_the_float32_verdicts_on_the_bundled_pairs(tiny_bert_dir, tmp_path):
    """The stated tolerance: a bf16-trained model gives the float32-trained model's verdict on >= 99% of the 459
    bundled pairs and its pair accuracy within 1 point (same seed, recipe and data; both scored in float32)."""
    require_bf16_units()
    from emoreward.data import load_pairs
    from emoreward.evaluation.judge import RewardModelJudge

    pairs = load_pairs("emoprefer")
    differences = {}
    for bf16 in (False, True):
        r1, r2 = RewardModelJudge(tiny_fit(tiny_bert_dir, tmp_path, bf16=bf16, pairs=pairs)).pair_rewards(pairs)
        differences[bf16] = r1 - r2
    agree = np.mean(np.sign(differences[False]) == np.sign(differences[True]))
    decided = np.array([p.label != "tie" for p in pairs])
    first = np.array([p.label == "1" for p in pairs])
    accuracy = {bf16: np.mean((d > 0)[decided] == first[decided]) for bf16, d in differences.items()}
    assert agree >= 0.99, agree
    assert abs(accuracy[True] - accuracy[False]) <= 0.01 and accuracy[False] > 0.6, accuracy


def test_bf16_training_saves_float32_safetensors(tiny_bert_dir, tmp_path):
    """A CPU bf16 run saves what a float32 run saves: its step checkpoints and the final model directory hold the
    same tensors (adapter and value head), all float32, in safetensors; the network is float32 again after it and
    scores in float32 (the live adapter equals the merged float32 copy to 1e-5)."""
    require_bf16_units()
    from safetensors.torch import load_file

    from emoreward.models.text import TextRewardModel

    texts = ["She smiles.", "A long, flat and tired voice says nothing at all today."]
    saved = {}
    for bf16 in (False, True):
        model = tiny_fit(
            tiny_bert_dir,
            tmp_path,
            bf16=bf16,
            pairs=synthetic_pairs(24),
            save=True,
            save_strategy="steps",
            save_steps=1,
        )
        assert {p.dtype for p in model.model.parameters()} == {torch.float32}
        # the network computes in float32 again (accelerate's autocast forward is gone): live adapter = merged copy
        live = TextRewardModel(model.model, model.tokenizer, model.settings).score(texts)
        np.testing.assert_allclose(live, model.inference_copy("float32").score(texts), atol=1e-5, rtol=0)
        out = model.save_pretrained(tmp_path / f"model-{bf16}")
        checkpoint = tmp_path / ("bf16" if bf16 else "fp32") / "checkpoint-1"
        files = [*checkpoint.glob("*.safetensors"), *out.glob("*.safetensors")]
        assert {f.parent for f in files} == {checkpoint, out}
        saved[bf16] = [load_file(f) for f in files]
    for fp32_file, bf16_file in zip(saved[False], saved[True], strict=True):
        assert fp32_file.keys() == bf16_file.keys()
        assert {t.dtype for t in (*fp32_file.values(), *bf16_file.values())} == {torch.float32}
