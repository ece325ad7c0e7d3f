"""Test helpers (like `transformers.testing_utils`): a scripted fake backend and a handful of labelled pairs."""

from __future__ import annotations

import random
import re
import time

from emoreward.data import PreferencePair
from zero_shot.backends.base import ChatRequest, Generation, SamplingConfig


class ScriptedBackend:
    """A fake text backend: prefers the description that shares more words with the reference (or, without
    one, the longer description); it mentions the other label mid-reasoning, as real models do.
    `crash_after` raises after that many calls (a simulated kill); `fail_if` makes calls whose prompt contains it
    fail; `delay_s` sleeps that long per request (a slow model, so a test can kill a run midway); `calls_log`
    appends one line per answered request to that file (so a test in another process can count the calls a
    subprocess made). Judge YAMLs reach it as `backend: scripted`; with `model: sampled` and `sampling.do_sample`
    it is a seeded sampling judge: half of its verdicts are drawn from the call's seed (`ChatRequest.seed`).
    `precision`: the precision identity it stands in for (`zero_shot.config.backend_precision` of the config it
    replaces; None: no weights)."""

    modalities = frozenset({"text"})

    def __init__(
        self,
        identity="scripted",
        crash_after=None,
        fail_if=None,
        *,
        batch_size=4,
        delay_s=0.0,
        calls_log=None,
        precision=None,
    ):
        self.identity = identity
        self.precision = precision
        self.calls: list[ChatRequest] = []
        self.crash_after = crash_after
        self.fail_if = fail_if
        self.batch_size = batch_size
        self.delay_s = delay_s
        self.calls_log = calls_log

    def generate(self, requests: list[ChatRequest], sampling: SamplingConfig) -> list[Generation]:
        out = []
        if self.delay_s:
            time.sleep(self.delay_s * len(requests))
        for r in requests:
            if self.crash_after is not None and len(self.calls) >= self.crash_after:
                raise KeyboardInterrupt("simulated kill")
            self.calls.append(r)
            if self.fail_if and self.fail_if in r.prompt:
                out.append(Generation(error="HTTP 500: boom"))
                continue
            text = self._answer(r.prompt)
            if sampling.do_sample and self.identity.endswith(":sampled") and "Answer: " in text:
                rng = random.Random(r.seed)  # the seed decides: another seed, another verdict half the time
                if rng.random() < 0.5:
                    text = text[: text.rindex("Answer: ")] + f"Answer: {rng.choice(['1', '2', 'tie'])}"
            out.append(Generation(text=text))
        if self.calls_log:
            with open(self.calls_log, "a", encoding="utf-8") as fh:
                fh.write("".join(f"{r.seed}\n" for r in requests))
        return out

    @staticmethod
    def _answer(prompt: str) -> str:
        if "Describe the emotional state" in prompt:
            return "The person is happy and relaxed, smiling warmly."
        if "According to this analysis" in prompt:
            m = re.search(r"prefer Description ([12])", prompt)
            return f"Answer: {m.group(1)}" if m else "Answer: tie"
        d1 = re.search(r"Description 1: (.*)", prompt).group(1)
        d2 = re.search(r"Description 2: (.*)", prompt).group(1)
        ref = re.search(r"reference description of a person's emotional state:\n(.*)", prompt)
        if ref:
            words = set(ref.group(1).lower().split())
            s1, s2 = len(words & set(d1.lower().split())), len(words & set(d2.lower().split()))
        else:
            s1, s2 = len(d1), len(d2)
        pick = "1" if s1 > s2 else "2" if s2 > s1 else "tie"
        other = "2" if pick == "1" else "1"
        if "Reason step by step" in prompt:
            return (
                f"Description {other} has some merit. Overall I prefer Description {pick}."
                if pick != "tie"
                else "Equal."
            )
        return (
            f"Description {other} is more detailed at first sight, but on reflection it misses cues.\nAnswer: {pick}"
        )


def demo_pairs() -> list[PreferencePair]:
    """Six labelled pairs: the labels follow the scripted backend's reference overlap, not always length."""
    rows = [
        ("s1", "The person is happy and smiling warmly.", "Sad.", "1"),
        ("s2", "Angry.", "The person is happy, relaxed and smiling.", "2"),
        ("s3", "Happy person, calm.", "A person who seems rather bored and tired today.", "1"),
        ("s4", "Neutral face.", "Neutral face!", "tie"),
        ("s5", "The person looks surprised and a little anxious about the news.", "Happy.", "2"),
        ("s6", "Relaxed and happy.", "Fearful and tense, avoiding eye contact with everyone.", "1"),
    ]
    return [PreferencePair(s, a, b, label, row=i + 1) for i, (s, a, b, label) in enumerate(rows)]
