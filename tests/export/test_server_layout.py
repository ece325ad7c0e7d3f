"""One token layout on every route: `/get_reward` recovers the description from OpenRLHF's query exactly (prompt,
end-of-turn / EOS, pad tokens and left padding removed, built the way OpenRLHF builds it) and scores it through
`text_input_ids`, so it gives the same reward as `/v1/rewards` and `model.score`; over-long descriptions are flagged
or refused; the character cap follows the token limit."""

import http.client
import json

import bpe_chat
import pytest
import torch
from _helpers import assert_same_rewards

from emoreward.export.serve.facts import served_model_facts
from emoreward.export.serve.http import RewardServer
from emoreward.export.serve.protocol import ServerLimits, max_chars_for
from emoreward.export.serve.routes.openrlhf import description_from_query, query_markers
from emoreward.export.serve.service import RewardService
from emoreward.models import TextRewardModel, TextSettings


DESCRIPTIONS = [
    "She smiles broadly; her voice rises: happy.",
    "  He is calm.\nThen he frowns, ANGRY!  ",  # leading / trailing spaces and a newline are part of the text
    "Sad 😢, eyes lowered — très triste.",
]


def post(server, path, payload):
    conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
    conn.request("POST", path, body=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = json.loads(resp.read() or b"{}")
    conn.close()
    return resp.status, data


@pytest.fixture(scope="module")
def qwen_like_tokenizer():
    return bpe_chat.qwen_like_tokenizer()


@pytest.fixture(scope="module")
def chat_model(qwen_like_tokenizer):
    """A tiny Llama reward model (value head `score`, chat layout) on that tokenizer."""
    return bpe_chat.tiny_chat_reward_model(qwen_like_tokenizer)


@pytest.fixture(scope="module")
def chat_server(chat_model):
    service = RewardService(chat_model, openrlhf_labels="subtitle")
    with RewardServer(service, port=0) as srv:
        yield srv


def openrlhf_query(tok, prompt: str, response: str) -> str:
    """Current OpenRLHF (SingleTurnAgentExecutor.execute): prompt ids from `tokenizer(prompt,
    add_special_tokens=False)`, vLLM's response ids end with the EOS it stopped at, and the query is
    `tokenizer.decode(prompt_ids + response_ids, skip_special_tokens=False)`."""
    prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    response_ids = tok(response, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    return tok.decode(prompt_ids + response_ids, skip_special_tokens=False)


def openrlhf_padded_queries(tok, prompts: list[str], responses: list[str]) -> list[str]:
    """Older OpenRLHF (experience_maker + Actor.process_sequences): prompts left-padded to one width, responses
    right-padded after their EOS, and `tokenizer.batch_decode(sequences, skip_special_tokens=False)` of the rows."""
    prompt_ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    response_ids = [tok(r, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for r in responses]
    pw, rw = max(map(len, prompt_ids)), max(map(len, response_ids))
    rows = [
        [tok.pad_token_id] * (pw - len(p)) + p + r + [tok.pad_token_id] * (rw - len(r))
        for p, r in zip(prompt_ids, response_ids)
    ]
    return tok.batch_decode(torch.tensor(rows), skip_special_tokens=False)


def test_every_form_of_one_description_gets_the_same_reward(chat_server, chat_model, qwen_like_tokenizer):
    tok = qwen_like_tokenizer
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "Describe the emotional state of the person."}],
        tokenize=False,
        add_generation_prompt=True,
    )
    for d in DESCRIPTIONS:
        expected = float(chat_model.score([d])[0])
        forms = {
            "/v1/rewards": ("/v1/rewards", {"descriptions": [d]}),
            "alone": ("/get_reward", {"query": [d]}),
            "end-of-turn": ("/get_reward", {"query": [d + "<|im_end|>"]}),
            "six pads": ("/get_reward", {"query": [d + "<|im_end|>" + "<|endoftext|>" * 6]}),
            "openrlhf": ("/get_reward", {"query": [openrlhf_query(tok, prompt, d)], "prompts": [prompt]}),
            "left-padded": (
                "/get_reward",
                {"query": ["<|endoftext|>" * 3 + prompt + d + "<|im_end|><|endoftext|>"], "prompts": [prompt]},
            ),
        }
        for name, (path, payload) in forms.items():
            if path == "/get_reward":  # what OpenRLHF sends without --data.label_key: no subtitle
                payload["labels"] = [""]
            status, data = post(chat_server, path, payload)
            assert status == 200, (name, data)
            assert data["rewards"] == [expected], (name, d)  # the same float, bit for bit
    # and the rewards differ between descriptions (the test would not notice a constant)
    assert len({float(r) for r in chat_model.score(DESCRIPTIONS)}) == 3


def test_padded_rollout_batch_and_labels_as_subtitles(chat_server, chat_model, qwen_like_tokenizer):
    tok = qwen_like_tokenizer
    prompts = [
        tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
        for q in ["Describe the emotion.", "Describe the emotional state of the person, in detail please.", "Hi"]
    ]
    queries = openrlhf_padded_queries(tok, prompts, DESCRIPTIONS)
    assert queries[0].startswith("<|endoftext|>") and queries[0].endswith("<|endoftext|>")  # padded on both sides
    labels = ["I got the job!", "", "Leave me alone."]
    status, data = post(chat_server, "/get_reward", {"query": queries, "prompts": prompts, "labels": labels})
    assert status == 200
    expected = chat_model.score(DESCRIPTIONS, ["I got the job!", None, "Leave me alone."])
    assert_same_rewards(data["rewards"], expected)
    assert data["scores"] == data["rewards"] and data["extra_logs"]["emotion_reward"] == data["rewards"]
    assert data["truncated"] == [False] * 3 and data["empty"] == [False] * 3
    # the subtitle changes the reward: labels were read as subtitles
    assert abs(data["rewards"][0] - float(chat_model.score([DESCRIPTIONS[0]])[0])) > 1e-4


def test_description_from_query_exact_text():
    pad, end = ["<|endoftext|>", "<|im_end|>"], ["<|endoftext|>", "<|im_end|>", "[SEP]"]
    assert description_from_query("P:  a b \n<|im_end|><|endoftext|>", "P:", pad, end) == "  a b \n"
    assert description_from_query("<|endoftext|><|endoftext|>P:x<|im_end|>", "P:", pad, end) == "x"
    assert description_from_query("[PAD] [PAD] P: x [SEP] [PAD]", "P:", ["[PAD]"], ["[PAD]", "[SEP]"]) == " x "
    assert description_from_query("Q:x", "P:", pad, end) is None
    assert description_from_query("", None, pad, end) == ""
    # a marker inside the description stays
    assert description_from_query("a<|im_end|>b<|im_end|>", None, pad, end) == "a<|im_end|>b"


def test_query_markers_include_the_models_own_tokens(chat_model):
    pad, end = query_markers(served_model_facts(chat_model), ["<|my_eos|>"])
    assert {"<|im_end|>", "<|endoftext|>", "<|my_eos|>"} <= set(pad) and "<|my_eos|>" in end


def test_pair_model_reads_the_same_description(tiny_bert_dir):
    """An encoder reward model behind a Qwen-style policy: the ChatML markers are stripped and the description
    scores as it does on /v1/rewards."""
    from transformers import AutoTokenizer, BertForSequenceClassification

    tok = AutoTokenizer.from_pretrained(tiny_bert_dir)
    settings = TextSettings(backbone="tiny-bert", input_format="pair", max_length=64)
    model = TextRewardModel(BertForSequenceClassification.from_pretrained(tiny_bert_dir).eval(), tok, settings)
    with RewardServer(RewardService(model), port=0) as srv:
        d = "She smiles; happy."
        expected = float(model.score([d])[0])
        prompt = "<|im_start|>user\nDescribe.<|im_end|>\n<|im_start|>assistant\n"
        for query in (d, prompt + d + "<|im_end|>", "<|endoftext|>" + prompt + d + "<|im_end|><|endoftext|>" * 4):
            status, data = post(
                srv, "/get_reward", {"query": [query], "prompts": [prompt] if "user" in query else None}
            )
            assert status == 200 and data["rewards"] == [expected]


def test_overlong_descriptions_are_flagged_or_refused(chat_model):
    long = "She smiles broadly and her voice rises; " * 25  # over 96 tokens, under the character cap
    info = chat_model.score_info([long, "Calm."])
    assert info.truncated.tolist() == [True, False]
    with RewardServer(RewardService(chat_model), port=0) as srv:
        status, data = post(srv, "/v1/rewards", {"descriptions": [long, "Calm."]})
        assert status == 200 and data["truncated"] == [True, False]
        assert data["rewards"] == pytest.approx(info.rewards.tolist(), abs=1e-6)
        assert data["n_tokens"] == info.n_tokens.tolist() and data["n_tokens"][0] == 96
        assert srv.service.stats.truncated == 1
        status, data = post(srv, "/get_reward", {"query": [long + "<|im_end|>"]})
        assert status == 200 and data["truncated"] == [True] and data["extra_logs"]["emotion_reward_truncated"] == [1]
    with RewardServer(RewardService(chat_model, overlong="refuse"), port=0) as srv:
        status, data = post(srv, "/v1/rewards", {"descriptions": ["Calm.", long]})
        assert status == 413 and "descriptions[1]" in data["error"] and "96 tokens" in data["error"]
        assert post(srv, "/v1/rewards", {"descriptions": ["Calm."]})[0] == 200
        assert srv.service.stats.refused_overlong == 1


def test_empty_descriptions_are_flagged_and_counted(chat_model):
    with RewardServer(RewardService(chat_model), port=0) as srv:
        status, data = post(srv, "/v1/rewards", {"descriptions": ["", "  \n", "Calm."]})
        assert status == 200 and data["empty"] == [True, True, False]
        assert data["rewards"] == pytest.approx(chat_model.score(["", "  \n", "Calm."]).tolist(), abs=1e-6)
        status, data = post(srv, "/get_reward", {"query": ["<|im_end|>"]})
        assert status == 200 and data["empty"] == [True] and data["extra_logs"]["emotion_reward_empty"] == [1.0]
        assert srv.service.stats.empty == 3
        assert "3 empty" in srv.service.stats.line()


def test_character_cap_follows_the_token_limit(chat_model, qwen_like_tokenizer):
    longest = max(len(t) for t in qwen_like_tokenizer.get_vocab())
    cap = max_chars_for(chat_model)
    assert cap == 96 * longest
    # a text at the cap is scored (cut to fit and flagged), one character more is refused before tokenizing
    with RewardServer(RewardService(chat_model), port=0) as srv:
        status, data = post(srv, "/v1/rewards", {"descriptions": ["a" * cap]})
        assert status == 200 and data["truncated"] == [True]
        status, data = post(srv, "/v1/rewards", {"descriptions": ["a" * (cap + 1)]})
        assert status == 413 and f"the limit is {cap}" in data["error"] and "96 tokens" in data["error"]
        assert srv.service.health()["max_length_tokens"] == 96
    # no text of at most max_length tokens is over the cap: the longest tokens, 96 of them, fit
    vocab = sorted(qwen_like_tokenizer.get_vocab(), key=len)
    assert len(qwen_like_tokenizer.convert_tokens_to_string([vocab[-1]] * 96)) <= cap
    # an explicit cap replaces the derived one
    assert RewardService(chat_model, ServerLimits(max_chars=500)).max_chars == 500
