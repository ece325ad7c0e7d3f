"""The vLLM client reads a ``/classify`` reply by its indices: each input answered once, in input order."""

import numpy as np
import pytest

from emoreward.export.vllm import classify_rewards


def test_rewards_are_placed_by_index():
    reply = {"data": [{"index": 1, "probs": [0.25]}, {"index": 0, "probs": [-1.5]}, {"index": 2, "probs": [3.0]}]}
    np.testing.assert_array_equal(classify_rewards(reply, 3, "http://x"), [-1.5, 0.25, 3.0])


@pytest.mark.parametrize(
    "indices",
    [[0, 0, 2], [0, 1], [0, 1, 2, 3], [1, 2, 3], ["0", 1, 2], [None, 1, 2], [0.0, 1, 2], [True, 1, 2]],
)
def test_a_reply_that_does_not_answer_each_input_once_is_refused(indices):
    reply = {"data": [{"index": i, "probs": [1.0]} for i in indices]}
    with pytest.raises(RuntimeError, match=r"http://x/classify returned results with indices .* for 3 inputs"):
        classify_rewards(reply, 3, "http://x")


@pytest.mark.parametrize("probs", [None, [], [0.3, 0.7], ["x"], [True], 0.5])
def test_a_result_that_is_not_one_score_is_refused(probs):
    """A one-label export's result is one number: a missing, empty, two-class or non-numeric ``probs`` is refused
    (a two-class reply gave exit 0 with its first class as the reward)."""
    reply = {"data": [{"index": 0, "probs": probs}]} if probs is not None else {"data": [{"index": 0}]}
    with pytest.raises(RuntimeError, match=r"http://x/classify returned"):
        classify_rewards(reply, 1, "http://x")
