"""The same refusals in a fresh process (`python -m emoreward.cli`, what the `emoreward` script runs): the process
exit status is 2 and stderr holds the one error line and nothing else, not even what the libraries print when they
are first imported (`emoreward train` imports the whole training stack before it reads its recipe)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bad_input_helpers import write


ROOT = Path(__file__).resolve().parents[2]


def emoreward(*argv) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path]), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "emoreward.cli", *map(str, argv)]
    return subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_evaluate_a_bad_csv(rm_dir, tmp_path):
    data = write(tmp_path / "p.csv", "name,a1,a2,preference\nv1,x,y,a1\nv2,x,,a2\n")
    result = emoreward("evaluate", "--model", rm_dir, "--data", data)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == f"emoreward evaluate: error: {data}, row 2, field 'a2': empty description\n"


def test_train_a_recipe_with_a_zero_step_schedule(tiny_bert_dir, tmp_path):
    recipe = write(
        tmp_path / "r.yaml",
        f"model_name_or_path: {tiny_bert_dir}\ncv_folds: 0\nmax_length: 64\nnum_train_epochs: 0\n"
        f"report_to: [none]\noutput_dir: {tmp_path / 'out'}\n",
    )
    result = emoreward("train", "--config", recipe, "--quiet")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        f"emoreward train: error: {recipe}, line 4: num_train_epochs=0.0 (with max_steps=-1) trains zero steps: "
        "set num_train_epochs > 0 or max_steps > 0\n"
    )
    assert not (tmp_path / "out").exists()
