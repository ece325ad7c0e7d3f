"""A new reward-model engine is one registration: an engine defined here (one that scores with the negated rewards of
the in-process model) is opened by `open_reward_model` and by `load_judge`, the one judge resolver, with nothing else
edited; the built-in engines (in process, an `emoreward serve` server) give the same rewards; an option that cannot
apply to the model (``media_root`` for a text model) and a server serving another model are refused."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from _helpers import save_tiny_bert_rm, synthetic_pairs

from emoreward.data.verdicts import Verdict
from emoreward.judges import load_judge
from emoreward.models.base import RewardModelBase
from emoreward.models.loading import (
    ENGINES,
    Engine,
    content_identity,
    open_reward_model,
    register_engine,
    unregister_engine,
)


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
    with pytest.raises(
        ValueError, match=r"unknown reward-model engine 'nope'; known: \[.*'negated'.*'server'.*entry-point group"
    ):
        open_reward_model(lora_dir, "nope")
    with pytest.raises(ValueError, match="a url .* does not apply"):
        open_reward_model(lora_dir, url="http://127.0.0.1:1")
    with pytest.raises(ValueError, match="give its url"):
        open_reward_model(lora_dir, "server")
    with pytest.raises(ValueError, match=r"media_root \(/tmp\) applies to multimodal reward models: .* text model"):
        open_reward_model(lora_dir, media_root="/tmp")  # a text model reads no media: refused, as a url is
    with pytest.raises(ValueError, match="media_root .* is a text model"):
        open_reward_model(lora_dir, "server", url="http://127.0.0.1:1", media_root="/tmp")  # before any request
    with pytest.raises(ValueError, match="already registered"):
        register_engine(Engine("negated", Negated, False, ""))
    assert {"in-process", "vllm", "server"} <= set(ENGINES)


def test_the_served_engines_are_found_by_name_without_importing_them_first():
    """A fresh interpreter that imports only the models floor opens the served engines by name: `find_engine` loads
    the module the `emoreward.engines` entry points name (it once said "unknown engine 'server'; registered:
    ['in-process']" unless the caller had imported emoreward.export; red team G, g11)."""
    code = (
        "import sys\n"
        "from emoreward.models.loading import ENGINES, find_engine\n"
        "assert 'emoreward.export' not in sys.modules and sorted(ENGINES) == ['in-process'], sorted(ENGINES)\n"
        "print(find_engine('server').name, find_engine('vllm').needs_url, sorted(ENGINES))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=os.environ | {"PYTHONPATH": os.getcwd()}
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[0] == "server True ['in-process', 'server', 'vllm']"


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


def test_the_server_engine_refuses_a_server_of_another_model(tmp_path):
    """A real ``emoreward serve`` of m0 on loopback: its ``/health`` reports m0's content identity, and opening m1
    against it is refused naming both identities (not m0's rewards under m1's name, and so in m1's score cache)."""
    m0 = save_tiny_bert_rm(tmp_path / "m0")
    m1 = save_tiny_bert_rm(tmp_path / "m1", hidden=32)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1", "EMOREWARD_DTYPE": "float32"}
    code = "import sys; from emoreward.cli import main; sys.exit(main(sys.argv[1:]))"
    cmd = [sys.executable, "-c", code, "serve", "--model", str(m0), "--port", "0", "--no-model-process"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = ""
        while "http://127.0.0.1:" not in line:
            line = proc.stdout.readline()
            assert line or proc.poll() is None, f"the server exited: {proc.stderr.read()[-2000:]}"
        url = "http://127.0.0.1:" + line.split("http://127.0.0.1:")[1].split()[0]
        served = open_reward_model(m0, "server", url=url)
        assert served.client.request("GET", "/health")["identity"] == content_identity(m0)
        want = open_reward_model(m0, dtype="float32").score(TEXTS, "hi")
        assert np.allclose(served.score(TEXTS, "hi"), want, rtol=0, atol=1e-6)
        assert content_identity(m0) != content_identity(m1)
        with pytest.raises(ValueError) as refused:
            open_reward_model(m1, "server", url=url)
        message = str(refused.value)
        assert "\n" not in message and f"content identity {content_identity(m0)}, not {m1}" in message
        assert f"(content identity {content_identity(m1)})" in message
    finally:
        proc.terminate()
        proc.wait(timeout=30)
