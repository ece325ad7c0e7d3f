"""The precision a reward model scores in: chosen once when it is loaded, recorded in every report, one tolerance for
every self-check (`reward_tolerance`), bf16 rewards within a stated bound of each other whatever the batch, and an
export that the check accepts in any precision. Each test pins the dtype it is about (none depends on the machine:
bf16 without bf16 units is exact but slower, and the tiny models keep it cheap)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from emoreward.models import TextRewardModel
from emoreward.models.precision import (
    ENV_VAR,
    KERNEL_CAPS,
    cpu_kind,
    model_precision,
    precision_record,
    reward_tolerance,
)


EPS = 2.0**-7  # bf16 machine epsilon
DESCRIPTIONS = [
    "She smiles broadly and her voice rises: she is happy.",
    "He frowns, speaks slowly and looks away; sad and tired.",
    "Neutral.",
    "A calm voice, a faint smile; content, perhaps relieved after the long wait that came before.",
    "Angry shouting.",
    "",
    "The woman laughs, then her face falls and she whispers something; surprise turning into worry.",
]


def test_reward_tolerance_by_hand():
    assert reward_tolerance(torch.float32) == reward_tolerance("float32", torch.float64) == 1e-5
    assert reward_tolerance(torch.bfloat16) == pytest.approx(3 * EPS)  # bf16 against bf16
    assert reward_tolerance("bf16", "float32") == pytest.approx(6 * EPS)  # bf16 against float32
    assert reward_tolerance(torch.bfloat16, magnitude=3.0) == pytest.approx(9 * EPS)  # grows with the rewards
    assert reward_tolerance(torch.bfloat16, magnitude=0.2) == pytest.approx(3 * EPS)  # never below 1 x eps units
    assert reward_tolerance(torch.float32, magnitude=100.0) == pytest.approx(1e-3)  # float32 grows with them too
    assert reward_tolerance(torch.float32, magnitude=0.5) == 1e-5


def test_the_cpu_kind_is_the_cpu_capped_by_the_kernel_selection():
    """One rule on every CPU kind; `cpu_kind` names the kernels a process runs: the CPU's flags, capped by the
    environment that selects torch's and oneDNN's kernels (`KERNEL_CAPS`: how CI runs this machine as AVX2-only)."""
    amx = {"avx2", "avx512f", "avx512_bf16", "amx_bf16"}
    assert cpu_kind(amx, {}) == "amx" and cpu_kind({"avx2", "avx512f", "avx512_bf16"}, {}) == "avx512_bf16"
    assert cpu_kind({"avx2", "avx512f"}, {}) == "avx512" and cpu_kind({"avx2"}, {}) == "avx2"
    assert cpu_kind({"fp", "asimd", "bf16"}, {}) == "default"  # Arm: not one of the x86 kinds measured
    assert cpu_kind(amx, KERNEL_CAPS) == "avx2" and cpu_kind(amx, {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}) == "avx512"
    assert cpu_kind(amx, {"ATEN_CPU_CAPABILITY": "default"}) == "default"
    assert cpu_kind({"avx2"}, {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"}) == "avx2"  # a cap never raises the kind
    assert set(KERNEL_CAPS) == {"ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS"}


def test_the_precision_is_chosen_once_when_the_model_is_loaded(lora_dir, monkeypatch):
    monkeypatch.setenv(ENV_VAR, "bfloat16")
    model = TextRewardModel.from_pretrained(lora_dir)
    assert model.scoring_precision == torch.bfloat16 and model_precision(model) == torch.bfloat16
    monkeypatch.setenv(ENV_VAR, "float32")  # a later change of the environment does not move a loaded model
    assert model.scoring_precision == torch.bfloat16
    record = precision_record(model)  # what pinned it when it was resolved, not the environment of now
    assert record["dtype"] == "bfloat16" and record["pinned_by"] == f"${ENV_VAR}=bfloat16"
    assert record["tolerance"] == pytest.approx(3 * EPS)
    model.scoring_dtype = "auto"  # asking again resolves again, by the same rule
    assert model.scoring_precision == torch.float32
    assert TextRewardModel.from_pretrained(lora_dir).scoring_precision == torch.float32


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_reward_does_not_depend_on_the_batch_beyond_the_stated_bound(lora_dir, dtype):
    """Alone, in one batch, in other mixes and other padding widths: float32 within 1e-5 x max(1, |r|) (not
    bit-identical on every CPU kind: 9.5e-7 at |r| 4.3 under the AVX2 kernel caps); bf16 within
    `reward_tolerance(bf16)` (2 bf16 units in the last place of the largest reward; the padded width and the
    number of rows change the kernels' blocking, measured up to 0.8 eps on MiniLM)."""
    model = TextRewardModel.from_pretrained(lora_dir, dtype=dtype)
    together = model.score(DESCRIPTIONS)
    bound = reward_tolerance(dtype, magnitude=float(np.max(np.abs(together))))
    alone = np.array([model.score([d])[0] for d in DESCRIPTIONS])
    np.testing.assert_allclose(alone, together, atol=bound, rtol=0)
    rng = np.random.default_rng(0)
    for _ in range(3):
        idx = rng.permutation(len(DESCRIPTIONS))[:4]
        mix = model.score([DESCRIPTIONS[i] for i in idx] + ["Another client's much longer request " * 5])
        np.testing.assert_allclose(mix[:4], together[idx], atol=bound, rtol=0)
    narrow = model.score_ids([model.encode(d).input_ids for d in DESCRIPTIONS], batch_size=2, pad_to_multiple_of=64)
    np.testing.assert_allclose(narrow, together, atol=bound, rtol=0)


def test_bf16_rewards_stay_within_the_cross_precision_bound_of_float32(lora_dir):
    full = TextRewardModel.from_pretrained(lora_dir, dtype="float32").score(DESCRIPTIONS)
    half = TextRewardModel.from_pretrained(lora_dir, dtype="bfloat16").score(DESCRIPTIONS)
    bound = reward_tolerance(torch.bfloat16, torch.float32, magnitude=float(np.max(np.abs(full))))
    assert 0 < np.max(np.abs(half - full)) <= bound  # bf16 does differ, and by no more than the bound


@pytest.mark.parametrize("pinned", ["bfloat16", "float32"])
def test_export_accepts_the_default_model_in_either_precision(lora_dir, tmp_path, monkeypatch, capsys, pinned):
    """`emoreward export` on a LoRA model where "auto" is bf16 (today's main refused it: the bf16 original against a
    float32 reload) and where it is float32: the check compares float32 with float32 at 1e-5 and says so."""
    from emoreward.cli import main

    monkeypatch.setenv(ENV_VAR, pinned)
    assert main(["export", "--model", str(lora_dir), "--output", str(tmp_path / "export")]) == 0
    out = capsys.readouterr().out
    assert "both scored in float32 (atol 1e-05: reward_tolerance(float32) at max |reward| " in out
    exported = TextRewardModel.from_pretrained(tmp_path / "export", dtype="float32").score(DESCRIPTIONS)
    original = TextRewardModel.from_pretrained(lora_dir, dtype=None).score(DESCRIPTIONS)  # live adapter, float32
    np.testing.assert_allclose(exported, original, atol=1e-5, rtol=0)
    settings = json.loads((tmp_path / "export" / "emoreward_config.json").read_text())
    assert settings["merged"] is True


def test_evaluate_records_the_precision(lora_dir, tmp_path, monkeypatch):
    from emoreward.cli import main
    from emoreward.data import load_pairs

    pairs = tmp_path / "pairs.jsonl"
    rows = [{"sample_id": p.sample_id, "description_1": p.description_1, "description_2": p.description_2,
             "label": p.label} for p in load_pairs("emoprefer")[:4]]  # fmt: skip
    pairs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    # the option wins over a pinning environment, and the record names the option (issue 41, F11: it named the
    # environment that lost, and nothing for --dtype alone)
    monkeypatch.setenv(ENV_VAR, "float32")
    for dtype in ("float32", "bfloat16"):
        assert main(["evaluate", "--model", str(lora_dir), "--data", str(pairs), "--dtype", dtype,
                     "--output", str(tmp_path / f"{dtype}.json")]) == 0  # fmt: skip
        report = json.loads((tmp_path / f"{dtype}.json").read_text())
        assert report["scoring_dtype"] == report["precision"]["dtype"] == dtype
        assert report["precision"]["tolerance"] == reward_tolerance(dtype)
        assert report["precision"]["pinned_by"] == f"dtype={dtype}"
    assert (
        main(["evaluate", "--model", str(lora_dir), "--data", str(pairs), "--output", str(tmp_path / "env.json")]) == 0
    )
    assert json.loads((tmp_path / "env.json").read_text())["precision"]["pinned_by"] == f"${ENV_VAR}=float32"


# ---------------------------------------------------------------------------------------------- the torch-free rule
@pytest.mark.parametrize("env", [None, "auto", "float32", "bf16"])
def test_the_rule_by_name_is_the_rule_by_dtype(monkeypatch, env):
    from emoreward.models.precision import DTYPE_NAMES, REDUCED_EPS, resolve_dtype, resolve_dtype_name

    if env is None:
        monkeypatch.delenv(ENV_VAR, raising=False)
    else:
        monkeypatch.setenv(ENV_VAR, env)
    for dtype in ("auto", "float32", "bfloat16", "fp16", torch.bfloat16, torch.float32):
        for units in (False, True):
            for agreement in (None, 0.99, 1.0):
                by_name = resolve_dtype_name(dtype, bf16_units=units, bf16_agreement=agreement)
                assert DTYPE_NAMES[by_name] == resolve_dtype(dtype, bf16_units=units, bf16_agreement=agreement)
    assert DTYPE_NAMES[resolve_dtype_name()] == resolve_dtype()  # this machine's CPU, through the same rule
    assert REDUCED_EPS == {name: torch.finfo(DTYPE_NAMES[name]).eps for name in REDUCED_EPS}
    with pytest.raises(ValueError, match="unknown dtype 'float8'"):
        resolve_dtype_name("float8")


def test_torch_bf16_answer_is_recorded_per_torch_build_cpu_and_onednn_caps(tmp_path, monkeypatch):
    from emoreward.models import precision as rule

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    path = rule.bf16_kernels_record_path()
    assert path == tmp_path / "emoreward" / "torch-cpu-bf16.json" and not path.exists()
    answer = rule._asked_torch()  # torch's own answer
    key = rule.torch_build_key()
    assert rule.torch_cpu_bf16_kernels() is answer
    assert json.loads(path.read_text()) == {key: answer}  # asked once, recorded for this build
    path.write_text(json.dumps({key: not answer}))
    assert rule.torch_cpu_bf16_kernels() is (not answer)  # the record is what a rerun reads (no torch call)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")  # a cap on oneDNN's instructions: another build key
    assert rule.torch_build_key() not in (None, key)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    path.write_text("{torn")  # an unreadable record: torch is asked again, never guessed
    assert rule.torch_cpu_bf16_kernels() is answer and json.loads(path.read_text()) == {key: answer}


def test_the_precision_module_imports_no_torch_until_its_torch_layer_is_used():
    """One module: the rule by name is read without torch (a ranking rerun from the score cache), the torch layer
    imports it when used."""
    import subprocess
    import sys

    code = (
        "import sys; from emoreward.models import precision as p; "
        "p.reward_tolerance('bf16'); p.precision_record(object()); p.resolve_dtype_name('float32'); "
        "before = 'torch' in sys.modules; p.DTYPE_NAMES; p.EmulatedBf16Matmuls; print(before, 'torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"]


def test_the_record_names_what_decided_the_dtype_option_then_environment_then_the_rule(lora_dir, monkeypatch):
    """One resolution, option > environment > auto (`dtype_request`), and the record names its winner: an explicit
    dtype over a pinning environment is the dtype's pin, never the environment's (issue 41, F11)."""
    from emoreward.models.precision import dtype_request
    from emoreward.models.saved import SavedRewardModel

    monkeypatch.setenv(ENV_VAR, "float32")
    assert dtype_request("bfloat16") == ("bfloat16", "dtype=bfloat16")
    assert dtype_request(torch.bfloat16) == ("bfloat16", "dtype=bfloat16")
    assert dtype_request("auto") == ("float32", f"${ENV_VAR}=float32")
    for model in (
        TextRewardModel.from_pretrained(lora_dir, dtype="bfloat16"),
        SavedRewardModel(lora_dir, dtype="bf16"),
    ):
        record = precision_record(model)
        assert (record["dtype"], record["pinned_by"]) == ("bfloat16", "dtype=bfloat16")
    record = precision_record(SavedRewardModel(lora_dir))
    assert (record["dtype"], record["pinned_by"]) == ("float32", f"${ENV_VAR}=float32")
    monkeypatch.delenv(ENV_VAR)
    assert dtype_request("auto") == ("auto", None)
    record = precision_record(SavedRewardModel(lora_dir, dtype="float32"))
    assert (record["dtype"], record["pinned_by"]) == ("float32", "dtype=float32")
    assert precision_record(TextRewardModel.from_pretrained(lora_dir, dtype="float32"))["pinned_by"] == "dtype=float32"
