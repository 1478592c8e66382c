"""Extracting routing fields from raw bodies: the fast path must agree with a full parse."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agrpo.proxy.prompts import Prompt, conversation_text
from agrpo.proxy.request_fields import BadRequest, _prompts_from_value, parse_routing_fields


def fields(payload, **dumps_kwargs):
    return parse_routing_fields(json.dumps(payload, **dumps_kwargs).encode())


def test_token_prompt_fields():
    f = fields({"model": "trl-policy-v2", "prompt": [5, 6, 7], "n": 8, "max_tokens": 64, "logprobs": 0, "stream": True})
    assert (f.model, f.n, f.max_tokens, f.stream) == ("trl-policy-v2", 8, 64, True)
    assert [(p.data, p.is_tokens, p.units) for p in f.prompts] == [(b"5,6,7", True, 3)]


def test_formatting_does_not_change_the_prompt_bytes():
    compact = fields({"prompt": [1, 22, 333]}, separators=(",", ":"))
    spaced = parse_routing_fields(b'{ "prompt" : [ 1 ,\n 22,   333 ] }')
    assert compact.prompts[0].data == spaced.prompts[0].data == b"1,22,333"


def test_batched_token_prompts():
    f = fields({"prompt": [[1, 2], [3], [4, 5, 6]], "max_tokens": 3})
    assert [p.data for p in f.prompts] == [b"1,2", b"3", b"4,5,6"]


def test_text_list_and_chat_prompts():
    assert [p.data for p in fields({"prompt": "hi"}).prompts] == ["hi"]
    assert [p.data for p in fields({"prompt": ["a", "b"]}).prompts] == ["a", "b"]
    messages = [{"role": "user", "content": "2+2?"}]
    f = fields({"messages": messages, "max_completion_tokens": 9})
    assert f.prompts[0].data == conversation_text(messages)
    assert f.max_tokens == 9


def test_defaults_when_fields_are_missing_or_null():
    f = fields({"prompt": [1], "n": None, "max_tokens": None, "model": 7})
    assert (f.model, f.n, f.max_tokens, f.stream) == ("", 1, None, False)
    g = fields({"prompt": [1], "max_completion_tokens": 9, "n": 3})
    assert (g.n, g.max_tokens) == (3, 9)


@pytest.mark.parametrize(
    "key,value",
    [
        ("n", 1e9),
        ("n", "1000000000"),
        ("n", "many"),
        ("n", 3.0),
        ("n", True),
        ("max_tokens", 3e9),
        ("max_tokens", "16"),
        ("max_completion_tokens", 16.5),
        ("best_of", 1e6),
        ("min_tokens", [1]),
    ],
)
def test_numeric_fields_must_be_json_integers(key, value):
    with pytest.raises(BadRequest, match=f"'{key}' must be a JSON integer"):
        fields({"prompt": [1], key: value})


def test_a_prompt_key_inside_another_value_is_not_taken_for_the_prompt():
    f = fields({"extra": {"prompt": [9, 9]}, "prompt": [1, 2], "model": "m"})
    assert f.prompts[0].data == b"1,2"
    g = fields({"extra": {"prompt": [9, 9]}, "model": "m"})
    assert g.prompts[0].data == ""  # no top-level prompt at all
    h = fields({"messages": [{"role": "user", "content": 'say "prompt": [1]'}]})
    assert "say" in h.prompts[0].data


def test_duplicate_prompt_key_uses_the_last_like_json():
    f = parse_routing_fields(b'{"prompt": [1, 2], "prompt": [3]}')
    assert f.prompts[0].data == b"3"


def test_unusual_arrays_fall_back_to_a_full_parse():
    assert fields({"prompt": [1, 2.5]}).prompts[0].data == json.dumps([1, 2.5], sort_keys=True)
    assert fields({"prompt": [[1, 2], "x"]}).prompts[0].is_tokens is False
    assert fields({"prompt": []}).prompts[0].units == 0


@pytest.mark.parametrize(
    "raw",
    [b"", b"[1]", b'{"prompt": [1, 2', b'{"a": 1} x', b"\xff{}", b'{"prompt": [1, 2]', b'{"prompt" [1]}', b"null"],
)
def test_malformed_bodies_raise_bad_request(raw):
    with pytest.raises(BadRequest):
        parse_routing_fields(raw)


@settings(max_examples=200, deadline=None)
@given(ids=st.lists(st.integers(0, 200_000), max_size=300), batched=st.booleans(), spaces=st.booleans())
def test_fast_path_equals_slow_path(ids, batched, spaces):
    prompt = [ids, ids[:3]] if batched else ids
    separators = (", ", ": ") if spaces else (",", ":")
    fast = fields({"model": "m", "prompt": prompt, "max_tokens": 5}, separators=separators)
    slow = _prompts_from_value(prompt)
    assert [p.data for p in fast.prompts] == [p.data for p in slow]
    assert [p.units for p in fast.prompts] == [len(p) for p in (prompt if batched else [prompt])]


def test_prefix_key_of_a_continuation_equals_the_key_of_the_earlier_prompt():
    earlier = Prompt.from_token_ids(range(37))
    later = Prompt.from_token_ids(list(range(37)) + [5, 6, 7])
    assert later.prefix_key(11, 37) == earlier.key(11)
    assert later.chain(11, 16)[:3] == earlier.chain(11, 16)[:3]
    text_earlier, text_later = Prompt.from_text("abcdef"), Prompt.from_text("abcdefgh")
    assert text_later.prefix_key(3, 6) == text_earlier.key(3)
    assert len(Prompt.from_token_ids(range(32)).chain(1, 16)) == 3  # seed + 2 full blocks
