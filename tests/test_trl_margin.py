"""TRL's `margin` column is used as TRL uses it: the loss of a decided pair is `-logsigmoid(r_chosen - r_rejected -
margin)` (`trl.RewardTrainer.compute_loss`), read from the data through the dataset and collator into the trainer's
loss; a margin that is not a number is refused naming the row."""

from __future__ import annotations

import math

import pytest
import torch

from emoreward.data import DataError, load_pairs
from emoreward.training.losses import reward_model_loss


def test_margin_in_the_loss_hand_computed():
    logits = torch.tensor([[1.0], [0.5], [0.2], [0.7]])  # chosen 1.0, 0.5; rejected 0.2, 0.7
    margin = torch.tensor([0.5, 0.0])
    loss = reward_model_loss(logits, tie=None, ties="drop", tie_parameter=1.0, margin=margin).loss
    expected = (
        math.log1p(math.exp(-0.3)) + math.log1p(math.exp(0.2))
    ) / 2  # d = 1.0-0.2-0.5, 0.5-0.7-0: (0.554355 + 0.798139) / 2
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert loss.item() == pytest.approx(0.676247, abs=1e-6)
    # TRL's own expression on the same numbers
    trl = -torch.nn.functional.logsigmoid(torch.tensor([1.0, 0.5]) - torch.tensor([0.2, 0.7]) - margin).mean()
    assert loss.item() == pytest.approx(trl.item(), abs=1e-7)
    # zero margins: the plain Bradley-Terry loss
    plain = reward_model_loss(logits, tie=None, ties="drop", tie_parameter=1.0).loss
    zero = reward_model_loss(logits, tie=None, ties="drop", tie_parameter=1.0, margin=torch.zeros(2)).loss
    assert zero.item() == plain.item()
    # a tie pair ignores its margin (a tie-aware loss is symmetric in the two descriptions)
    tie = torch.tensor([0.0, 1.0])
    with_tie = reward_model_loss(
        logits, tie=tie, ties="rao-kupper", tie_parameter=1.0, margin=torch.tensor([0.5, 9.0])
    )
    same = reward_model_loss(logits, tie=tie, ties="rao-kupper", tie_parameter=1.0, margin=torch.tensor([0.5, 0.0]))
    assert with_tie.loss.item() == same.loss.item()


def test_margin_reaches_the_trainer_loss(tiny_bert_dir, tmp_path):
    from emoreward.training.adapters import adapter_for
    from emoreward.training.config import load_config
    from emoreward.training.dataset_cache import encoded_dataset
    from emoreward.training.trainer import EmoRewardTrainer

    rows = [
        {"chosen": "She is smiling warmly.", "rejected": "He is frowning.", "margin": 2.0},
        {"chosen": "A bright laugh.", "rejected": "A flat voice.", "margin": 0.5},
        {"chosen": "Eyes shining.", "rejected": "Eyes downcast."},  # no margin: 0
    ]
    pairs = load_pairs(rows)
    assert [p.margin for p in pairs] == [2.0, 0.5, None]
    config = load_config(
        overrides={
            "model_name_or_path": str(tiny_bert_dir),
            "lora_target_modules": ["query", "value"],
            "max_length": 64,
            "bf16": False,
            "report_to": ["none"],
            "output_dir": str(tmp_path / "out"),
            "cv_folds": 0,
        }
    )
    adapter = adapter_for(config)
    model = adapter.build_model(config)
    dataset, _ = encoded_dataset(pairs, model, config)
    assert dataset["margin"] == [2.0, 0.5, 0.0]
    collator = adapter.collator(model, config)
    batch = collator([dataset[i] for i in range(3)])
    assert batch["margin"].tolist() == [2.0, 0.5, 0.0]
    trainer = EmoRewardTrainer(
        adapter=adapter,
        model=model.model,
        args=config,
        train_dataset=dataset,
        processing_class=model.tokenizer,
        data_collator=collator,
    )
    model.model.eval()
    with torch.no_grad():
        loss, out = trainer.compute_loss(model.model, dict(batch), return_outputs=True)
        expected = -torch.nn.functional.logsigmoid(
            out["rewards_chosen"] - out["rewards_rejected"] - torch.tensor([2.0, 0.5, 0.0])
        ).mean()
    assert loss.item() == pytest.approx(expected.item(), abs=1e-6)
    assert (
        abs(
            expected.item()
            + torch.nn.functional.logsigmoid(out["rewards_chosen"] - out["rewards_rejected"]).mean().item()
        )
        > 0.1
    )


def test_a_margin_that_is_not_a_number_names_the_row():
    with pytest.raises(DataError, match=r"row 2.*margin.*expected a finite number, got 'much'"):
        load_pairs([{"chosen": "a", "rejected": "b", "margin": 1}, {"chosen": "c", "rejected": "d", "margin": "much"}])
    with pytest.raises(DataError, match="margin"):
        load_pairs([{"chosen": "a", "rejected": "b", "margin": float("inf")}])


def test_a_nan_margin_is_refused_and_a_null_or_absent_one_is_missing(tmp_path):
    """A NaN margin in a file is a number that is not finite (refused naming file, row and field, as an infinity is);
    a JSON null, an absent key, a parquet null or pandas' empty cell is a missing margin (0 in the loss)."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "m.jsonl"
    path.write_text('{"chosen": "a", "rejected": "b", "margin": null}\n{"chosen": "c", "rejected": "d"}\n')
    assert [p.margin for p in load_pairs(path)] == [None, None]
    for literal in ("NaN", "Infinity", "-Infinity"):
        path.write_text(
            f'{{"chosen": "a", "rejected": "b", "margin": 1}}\n{{"chosen": "c", "rejected": "d", "margin": {literal}}}\n'
        )
        with pytest.raises(
            DataError, match=rf"^{path}, row 2, field 'margin': expected a finite number, got -?(nan|inf)$"
        ):
            load_pairs(path)
    table = pa.table({"chosen": ["a", "c", "e"], "rejected": ["b", "d", "f"], "margin": [1.5, None, math.nan]})
    pq.write_table(table, tmp_path / "m.parquet")
    with pytest.raises(DataError, match=r"m\.parquet, row 3, field 'margin': expected a finite number, got nan"):
        load_pairs(tmp_path / "m.parquet")
    pq.write_table(table.slice(0, 2), tmp_path / "ok.parquet")
    assert [p.margin for p in load_pairs(tmp_path / "ok.parquet")] == [1.5, None]
    frame = pd.DataFrame({"chosen": ["a", "c"], "rejected": ["b", "d"], "margin": [2.0, None]})
    assert math.isnan(frame["margin"][1])  # pandas' empty cell: missing, not a NaN margin
    assert [p.margin for p in load_pairs(frame)] == [2.0, None]
