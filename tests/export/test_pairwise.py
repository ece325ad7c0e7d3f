"""Pairwise judges as GRPO group rewards: hand-computed win rates, groups from the prompt's content (shuffled,
interleaved and split over two processes: the same rewards), the judge budget, and a real GRPOTrainer run."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
from itertools import combinations
from pathlib import Path

import numpy as np
import pytest

from emoreward.data.verdicts import Judgement, Verdict
from emoreward.export.pairwise import PairwiseGroupReward, opponent_pairs, verl_group_scores


ROOT = Path(__file__).resolve().parents[2]


class BangJudge:
    """A generative-judge stand-in with a known rule: the description with more '!' wins; on a draw it answers
    FIRST (position bias, so the two orders disagree and average to a tie); a '?' in either makes it INVALID."""

    name = "bang"

    def __init__(self):
        self.asked = []

    def judge(self, pairs, *, run=0):
        self.asked += [(p.description_1, p.description_2) for p in pairs]
        out = []
        for p in pairs:
            a, b = p.description_1.count("!"), p.description_2.count("!")
            if "?" in p.description_1 + p.description_2:
                verdict = Verdict.INVALID
            else:
                verdict = Verdict.FIRST if a >= b else Verdict.SECOND
            out.append(Judgement(p.sample_id, verdict, run=run))
        return out


def hand_win_rates(texts: list[str]) -> list[float]:
    """The definition, written out: mean over the other completions of 1 / 0.5 / 0 by the number of '!'."""
    out = []
    for i, a in enumerate(texts):
        scores = []
        for j, b in enumerate(texts):
            if i != j:
                x, y = a.count("!"), b.count("!")
                scores.append(1.0 if x > y else 0.0 if x < y else 0.5)
        out.append(sum(scores) / len(scores))
    return out


GROUP_A = ["glad!!!", "calm!", "happy!!", "calm!"]  # a repeated completion
GROUP_B = ["angry!", "tense", "furious!!", "sad!"]  # "angry!" / "sad!": a draw judged FIRST both ways


def batch():
    prompts = ["Describe the emotion. Subtitle: I won!"] * 4 + ["Describe the emotion. Subtitle: Go away."] * 4
    return prompts, GROUP_A + GROUP_B


def test_win_rates_equal_the_hand_computation():
    prompts, completions = batch()
    judge = BangJudge()
    reward = PairwiseGroupReward(judge, length_monitor=False)
    got = reward(prompts, completions)
    np.testing.assert_allclose(got, hand_win_rates(GROUP_A) + hand_win_rates(GROUP_B), atol=0)
    # distinct pairs of each group, both orders; the repeated "calm!" costs nothing
    assert reward.cost.comparisons == 3 + 6
    assert reward.cost.judge_calls == len(judge.asked) == 2 * 9
    assert reward.cost.identical == 1 and reward.cost.invalid_orders == 0


def test_shuffled_and_interleaved_batches_give_each_completion_the_same_reward():
    prompts, completions = batch()
    base = dict(
        zip(zip(prompts, completions), PairwiseGroupReward(BangJudge(), length_monitor=False)(prompts, completions))
    )
    order = list(range(8))
    random.Random(3).shuffle(order)
    shuffled = PairwiseGroupReward(BangJudge(), length_monitor=False)(
        [prompts[k] for k in order], [completions[k] for k in order]
    )
    assert shuffled == [base[(prompts[k], completions[k])] for k in order]
    # one prompt in two Unicode forms (NFC / NFD) and padded: still one group
    import unicodedata

    cafe = ["Subtitle: Un caf\u00e9!"] * 4
    mixed = [cafe[0], unicodedata.normalize("NFD", cafe[0]), cafe[0] + "  ", unicodedata.normalize("NFD", cafe[0])]
    assert mixed[1] != mixed[0]
    plain = PairwiseGroupReward(BangJudge(), length_monitor=False)(cafe, GROUP_A)
    assert PairwiseGroupReward(BangJudge(), length_monitor=False)(mixed, GROUP_A) == plain == hand_win_rates(GROUP_A)


def test_the_same_prompt_of_two_samples_is_two_groups():
    prompts = ["Describe the emotion in the clip."] * 4
    completions = ["a!", "b", "c!!", "d"]
    split = PairwiseGroupReward(BangJudge(), length_monitor=False)(
        prompts, completions, sample_id=["v1", "v1", "v2", "v2"]
    )
    assert split == [1.0, 0.0, 1.0, 0.0]


def test_invalid_orders_fall_back_to_the_other_order_or_a_tie():
    reward = PairwiseGroupReward(BangJudge(), length_monitor=False)
    got = reward(["p"] * 3, ["ok!!", "what?", "meh"])
    # every pair with "what?" is INVALID both ways: 0.5; "ok!!" beats "meh"
    assert got == [0.75, 0.5, 0.25]
    assert reward.cost.undecided == 2 and reward.cost.invalid_orders == 4


def test_the_budget_meets_the_stated_number_of_opponents():
    texts = [f"t{k}" + "!" * k for k in range(6)]
    pairs = opponent_pairs(texts, 2)
    met = {t: sum(t in p for p in pairs) for t in texts}
    assert set(met.values()) == {2} and len(pairs) == 6
    assert len(opponent_pairs(texts, None)) == len(list(combinations(texts, 2))) == len(opponent_pairs(texts, 5))
    # the pairing follows content, not input order
    assert sorted(opponent_pairs(texts[::-1], 2)) == sorted(pairs)
    judge = BangJudge()
    reward = PairwiseGroupReward(judge, opponents=2, length_monitor=False)
    got = reward(["p"] * 6, texts)
    assert reward.cost.judge_calls == 12
    for text, value in zip(texts, got):
        opponents = [b if a == text else a for a, b in pairs if text in (a, b)]
        assert value == np.mean([1.0 if text.count("!") > o.count("!") else 0.0 for o in opponents])


def test_bad_arguments_are_refused():
    with pytest.raises(TypeError, match="judge"):
        PairwiseGroupReward(object())
    with pytest.raises(ValueError, match="opponents"):
        PairwiseGroupReward(BangJudge(), opponents=0)
    with pytest.raises(ValueError, match="one prompt per completion"):
        PairwiseGroupReward(BangJudge())(["p"], ["a", "b"])


def test_a_scalar_reward_model_as_the_judge_ranks_by_reward(tmp_path):
    import torch
    from test_grpo import MINILM  # the test folder is on the path (conftest)
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from emoreward.evaluation.judge import RewardModelJudge
    from emoreward.models import TextRewardModel, TextSettings

    tok = AutoTokenizer.from_pretrained(MINILM)
    config = BertConfig(
        vocab_size=tok.vocab_size,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        num_labels=1,
        initializer_range=0.5,
    )
    torch.manual_seed(0)
    model = TextRewardModel(BertForSequenceClassification(config).eval(), tok, TextSettings(backbone="minilm"))
    texts = ["She is calm.", "He shouts in anger.", "A faint smile, relief.", "Tears and a trembling voice."]
    reward = PairwiseGroupReward(RewardModelJudge(model, tie_threshold=0.0), length_monitor=False)
    logged = {}
    got = reward(["p"] * 4, texts, log_metric=logged.__setitem__)
    r = model.score(texts, [None] * 4)
    assert got == [float(np.mean([r[i] > r[j] for j in range(4) if j != i])) for i in range(4)]
    # the counts are the work done: 6 comparisons, 12 verdicts, 4 descriptions scored (the judge's cache serves
    # the other 8 lookups)
    name = reward.__name__
    assert (reward.cost.comparisons, reward.cost.verdicts, reward.cost.judge_calls) == (6, 12, 4)
    assert (logged[f"{name}/comparisons"], logged[f"{name}/verdicts"], logged[f"{name}/judge_calls"]) == (6, 12, 4)


def test_default_names_differ_by_judge_and_an_explicit_name_is_kept():
    """TRL logs a reward function under its ``__name__``: two judges of two models never share one by default;
    one model's two judges do; an explicit name is kept."""
    from test_grpo import MINILM, tiny_reward_model
    from transformers import AutoTokenizer

    from emoreward.evaluation.judge import RewardModelJudge

    tok = AutoTokenizer.from_pretrained(MINILM)
    first, second = tiny_reward_model(tok, seed=0), tiny_reward_model(tok, seed=1)
    names = [PairwiseGroupReward(RewardModelJudge(m)).__name__ for m in (first, second, first)]
    assert names[0] != names[1] and names[0] == names[2] and names[0].startswith("pairwise_emotion_reward_")
    assert PairwiseGroupReward(RewardModelJudge(second), name="pairwise").__name__ == "pairwise"

    class Quiet(BangJudge):  # another judge of the same kind, under another name
        name = "quiet"

    assert PairwiseGroupReward(BangJudge()).__name__ != PairwiseGroupReward(Quiet()).__name__


SCRIPT = textwrap.dedent(
    """
    import json, sys
    from accelerate import PartialState
    sys.path.insert(0, {tests!r})
    from test_pairwise import BangJudge, batch
    from emoreward.export.pairwise import PairwiseGroupReward
    state = PartialState(cpu=True)  # as GRPOConfig(use_cpu=True) starts it
    prompts, completions = batch()
    order = [5, 0, 7, 2, 1, 6, 3, 4]  # each process holds parts of both groups
    half = order[state.process_index :: state.num_processes]
    judge = BangJudge()
    reward = PairwiseGroupReward(judge, length_monitor=False)
    got = reward([prompts[k] for k in half], [completions[k] for k in half])
    out = {{"rank": state.process_index, "index": half, "rewards": got, "asked": len(judge.asked)}}
    open({out!r} + f"/rank{{state.process_index}}.json", "w").write(json.dumps(out))
    state.wait_for_everyone()
    import torch.distributed
    torch.distributed.destroy_process_group()  # a clean gloo teardown: no abort at exit on a busy machine
    """
)


def test_a_batch_split_over_two_processes_gets_the_one_process_rewards(tmp_path):
    script = tmp_path / "split.py"
    script.write_text(SCRIPT.format(tests=str(Path(__file__).parent), out=str(tmp_path)))
    ddp = ROOT / "recipes" / "accelerate_configs" / "ddp.yaml"  # the README's launch; gloo on a CPU machine
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ddp), "--num_processes", "2"]
    cmd += ["--main_process_port", "0", str(script)]
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    prompts, completions = batch()
    expected = PairwiseGroupReward(BangJudge(), length_monitor=False)(prompts, completions)
    parts = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for part in parts:
        assert part["rewards"] == [expected[k] for k in part["index"]]
    # each distinct comparison judged once, by one process (both orders)
    assert sum(part["asked"] for part in parts) == 2 * 9


def test_grpo_trainer_steps_with_pairwise_group_rewards(tmp_path):
    import torch
    from datasets import Dataset
    from test_grpo import MINILM
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    tok = AutoTokenizer.from_pretrained(MINILM)
    tok.eos_token, tok.padding_side = "[SEP]", "left"
    config = LlamaConfig(
        vocab_size=tok.vocab_size,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=128,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.sep_token_id,
        bos_token_id=tok.cls_token_id,
    )
    torch.manual_seed(0)
    subtitles = ["I got the job!", "Leave me alone.", "It is fine, I guess.", "Why would you do that?"]
    dataset = Dataset.from_dict({"prompt": [f"Describe the emotion. Subtitle: {s}" for s in subtitles]})

    class LengthJudge:  # a known rule on generated text: the longer description wins, equal lengths tie
        name = "longer"

        def judge(self, pairs, *, run=0):
            verdict = {1: Verdict.FIRST, -1: Verdict.SECOND, 0: Verdict.TIE}
            return [
                Judgement(p.sample_id, verdict[int(np.sign(len(p.description_1) - len(p.description_2)))])
                for p in pairs
            ]

    reward = PairwiseGroupReward(LengthJudge(), name="pairwise")
    seen = []

    def recording(prompts, completions, **kwargs):
        out = reward(prompts, completions, **kwargs)
        seen.append((list(prompts), list(completions), out))
        return out

    recording.__name__ = "pairwise"
    args = GRPOConfig(
        output_dir=str(tmp_path / "grpo"),
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=8,
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
        model=LlamaForCausalLM(config),
        reward_funcs=[recording],
        args=args,
        train_dataset=dataset,
        processing_class=tok,
    )
    trainer.train()
    assert seen
    for prompts, completions, rewards in seen:
        groups = {}
        for k, p in enumerate(prompts):
            groups.setdefault(p, []).append(k)
        assert all(len(g) == 4 for g in groups.values())
        for members in groups.values():
            lengths = [len(completions[k].strip()) for k in members]
            for k, length in zip(members, lengths):
                others = lengths[:]
                others.remove(length)
                hand = np.mean([1.0 if length > o else 0.0 if length < o else 0.5 for o in others])
                assert rewards[k] == pytest.approx(hand, abs=0)
    assert any("pairwise/comparisons" in h for h in trainer.state.log_history)


def test_verl_batch_groups_are_dataset_rows_wherever_they_stand():
    prompts, completions = batch()
    rows = [{"index": 0, "subtitle": "I won!"}] * 4 + [{"index": 1, "subtitle": "Go away."}] * 4
    order = [3, 6, 0, 1, 7, 2, 5, 4]
    got = verl_group_scores(
        BangJudge(), ["emo"] * 8, [completions[k] for k in order], [None] * 8, [rows[k] for k in order]
    )
    expected = hand_win_rates(GROUP_A) + hand_win_rates(GROUP_B)
    assert [d["score"] for d in got] == [expected[k] for k in order]
    assert all(set(d) == {"score", "comparisons"} for d in got)


def test_two_clips_asked_the_same_instruction_are_two_groups_whatever_the_column_is_called():
    prompts = ["Describe the emotion in the clip."] * 8
    completions = ["a", "b!", "c!!", "d!!!"] * 2
    got = PairwiseGroupReward(BangJudge(), length_monitor=False)(prompts, completions, name=["v1"] * 4 + ["v2"] * 4)
    assert got == hand_win_rates(completions[:4]) * 2
    # what the trainer passes beside the columns does not split a group
    same = PairwiseGroupReward(BangJudge(), length_monitor=False)(
        prompts[:4], completions[:4], completion_ids=[[1], [2], [3], [4]], trainer_state=None
    )
    assert same == hand_win_rates(completions[:4])
