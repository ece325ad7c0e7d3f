"""A new reward-model engine is one registration: an engine defined here (one that scores with the negated rewards of
the in-process model) is opened by `open_reward_model` and by `load_judge`, the one judge resolver, with nothing else
edited; the built-in engines (in process, an `emoreward serve` server) give the same rewards."""

from __future__ import annotations

import numpy as np
import pytest
from _helpers import synthetic_pairs

from emoreward.data.verdicts import Verdict
from emoreward.judges import load_judge
from emoreward.models.base import RewardModelBase
from emoreward.models.loading import ENGINES, Engine, open_reward_model, register_engine, unregister_engine


TEXTS = ["She smiles warmly at her friend.", "A flat, tired voice.", "He shouts, red in the face."]


class Negated(RewardModelBase):
    """-r(description | context) of the in-process model: `score_contexts` is all an engine's model writes."""

    def __init__(self, inner):
        self.inner, self.settings, self.kind = inner, inner.settings, inner.kind

    def score_contexts(self, descriptions, contexts, *, batch_size=None):
        info = self.inner.score_info(descriptions, contexts, batch_size=batch_size)
        info.rewards = -info.rewards
        return info


@pytest.fixture
def negated_engine():
    engine = register_engine(
        Engine("negated", lambda source, **kw: Negated(open_reward_model(source, **kw)), False, "-r (a test engine)")
    )
    yield engine
    unregister_engine("negated")


def test_an_engine_registered_in_one_file_opens_scores_and_judges(lora_dir, negated_engine):
    plain = open_reward_model(lora_dir)
    toy = open_reward_model(lora_dir, "negated")
    subtitles = ["hi", None, "what?"]
    expected = plain.score(TEXTS, subtitles)
    assert np.array_equal(toy.score(TEXTS, subtitles), -expected)  # the base's score: score_info's rewards
    assert np.array_equal(toy.score(TEXTS, "hi"), -plain.score(TEXTS, ["hi"] * 3))  # one context for all
    with pytest.raises(ValueError, match="3 descriptions but 2 contexts"):
        toy.score(TEXTS, ["a", "b"])

    pairs = synthetic_pairs(12)
    normal = load_judge(lora_dir, tie_threshold=0.0).judge(pairs)
    flipped = load_judge(lora_dir, tie_threshold=0.0, engine="negated").judge(pairs)
    swap = {Verdict.FIRST: Verdict.SECOND, Verdict.SECOND: Verdict.FIRST, Verdict.TIE: Verdict.TIE}
    assert [j.verdict for j in flipped] == [swap[j.verdict] for j in normal]
    assert {j.verdict for j in normal} == {Verdict.FIRST, Verdict.SECOND}


def test_the_engine_registry_refuses_what_does_not_apply(lora_dir, negated_engine):
    with pytest.raises(ValueError, match=r"unknown reward-model engine 'nope'; registered: \[.*'negated'"):
        open_reward_model(lora_dir, "nope")
    with pytest.raises(ValueError, match="a url .* does not apply"):
        open_reward_model(lora_dir, url="http://127.0.0.1:1")
    with pytest.raises(ValueError, match="give its url"):
        open_reward_model(lora_dir, "server")
    with pytest.raises(ValueError, match="already registered"):
        register_engine(Engine("negated", Negated, False, ""))
    assert {"in-process", "vllm", "server"} <= set(ENGINES)


def test_the_server_engine_scores_as_the_model_in_process(lora_dir):
    from emoreward.export.serve.http import RewardServer
    from emoreward.export.serve.service import RewardService

    plain = open_reward_model(lora_dir)
    subtitles = ["hi", None, "what?"]
    with RewardServer(RewardService(open_reward_model(lora_dir)), port=0) as srv:
        served = open_reward_model(lora_dir, "server", url=f"http://{srv.host}:{srv.port}")
        info = served.score_info(TEXTS, subtitles)
        assert served.precision_name == plain.precision["dtype"]
    want = plain.score_info(TEXTS, subtitles)
    tolerance = plain.precision["tolerance"]  # the one rule of "the same reward" (batches differ on the server)
    assert np.allclose(info.rewards, want.rewards, rtol=0, atol=tolerance)
    assert info.n_tokens.tolist() == want.n_tokens.tolist() and not info.truncated.any()
