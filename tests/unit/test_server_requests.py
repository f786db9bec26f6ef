"""The API server's request parsing: every hostile body is a one-line 4xx naming the field, never an exception."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from app.server.api_errors import ApiError
from app.server.requests import Limits, parse_body, parse_chat, parse_completion, slot_id
from engine_ext.params import SamplingParams

DEFAULTS = SamplingParams(temperature=0.7, top_k=40, seed=7)
USER = [{"role": "user", "content": "hi"}]
LIMITS = Limits()


def chat(body: dict[str, Any], limits: Limits = LIMITS) -> Any:
    return parse_chat(body, DEFAULTS, limits, "m")


def refused(body: dict[str, Any], status: int = 400, limits: Limits = LIMITS) -> ApiError:
    with pytest.raises(ApiError) as caught:
        chat(body, limits)
    assert caught.value.status == status
    assert "\n" not in caught.value.message and len(caught.value.message) < 300
    return caught.value


def test_a_plain_request_takes_the_server_defaults_and_openai_names() -> None:
    job = chat({"model": "x", "messages": USER, "user": "u", "n": 1, "logprobs": False, "stream": None})
    assert job.sampling == DEFAULTS and job.max_tokens == -1 and not job.stream
    assert job.speculative is None and job.control_vectors is None
    job = chat(
        {
            "messages": [{"role": "developer", "content": [{"type": "text", "text": "be brief"}]}, *USER],
            "temperature": 0,
            "top_p": 0.5,
            "seed": 3,
            "max_completion_tokens": 9,
            "stop": "END",
            "stream": True,
            "stream_options": {"include_usage": True},
            "speculative": {"type": "ngram-simple", "n_max": 8},
            "control_vectors": [{"name": "calm", "strength": -2.5, "layers": [2, 9]}],
            "chat_template_kwargs": {"enable_thinking": False},
        }
    )
    assert job.messages[0].role == "system" and job.messages[0].content == "be brief"
    assert job.sampling.temperature == 0 and job.sampling.top_p == 0.5 and job.sampling.seed == 3
    assert job.sampling.top_k == 40  # not given: the server's
    assert job.max_tokens == 9 and job.stop == ("END",) and job.stream and job.include_usage
    assert job.speculative is not None and job.speculative.types == ("ngram-simple",) and job.speculative.n_max == 8
    assert job.control_vectors is not None and job.control_vectors[0].layers == (2, 9)
    assert job.enable_thinking is False


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"messages": USER, "temperature": "hot"}, "temperature"),
        ({"messages": USER, "temperature": True}, "temperature"),
        ({"messages": USER, "temperature": 1e308}, "temperature"),
        ({"messages": USER, "top_k": 10**30}, "top_k"),
        ({"messages": USER, "max_tokens": 0}, "max_tokens"),
        ({"messages": USER, "max_tokens": 1.5}, "max_tokens"),
        ({"messages": USER, "n": 2}, "n"),
        ({"messages": USER, "stop": ["a"] * 17}, "stop"),
        ({"messages": USER, "stop": [""]}, "stop"),
        ({"messages": USER, "frobnicate": 1}, "frobnicate"),
        ({"messages": USER, "tools": [{"type": "function"}]}, "tools"),
        ({"messages": USER, "response_format": {"type": "json_schema"}}, "response_format"),
        ({"messages": USER, "response_format": {"type": "yaml"}}, "response_format"),
        ({"messages": USER, "grammar": "root ::= x", "json_schema": {}}, "grammar"),
        ({"messages": USER, "logit_bias": {"1": 5}}, "logit_bias"),
        ({"messages": USER, "speculative": {"type": 3}}, "speculative"),
        ({"messages": USER, "speculative": {"type": "ngram-simple", "path": "/etc"}}, "speculative"),
        ({"messages": USER, "control_vectors": [{"name": "a", "file": "/etc/passwd"}]}, "control_vectors"),
        ({"messages": USER, "control_vectors": [{"name": "a", "layers": [5, 1]}]}, "control_vectors"),
        ({"messages": USER, "control_vectors": [{"name": "a", "strength": 1e9}]}, "control_vectors"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, "messages"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages"),
        ({"messages": [{"role": "user", "content": "\ud800"}]}, "messages"),
    ],
)
def test_bad_fields_are_a_400_naming_the_field(body: dict[str, Any], field: str) -> None:
    assert refused(body).param == field


def test_limits_bound_messages_text_and_tokens() -> None:
    limits = Limits(max_messages=3, max_text_chars=10, max_tokens=50)
    assert refused({"messages": USER * 4}, 413, limits).param == "messages"
    refused({"messages": [{"role": "user", "content": "x" * 11}]}, 413, limits)
    assert refused({"messages": USER, "max_tokens": 51}, 400, limits).param == "max_tokens"
    assert chat({"messages": USER}, limits).max_tokens == 50  # no ask: the server's most


def test_bodies_that_are_not_json_objects() -> None:
    for raw in (b"", b"[1]", b"{", b"\xff\xfe", b'{"a": NaN}', b'{"a": Infinity}', b"[" * 100_000):
        with pytest.raises(ApiError) as caught:
            parse_body(raw)
        assert caught.value.status == 400
    assert parse_body(b'{"a": 1}') == {"a": 1}


def test_completions_take_prompts_a_suffix_and_echo() -> None:
    job = parse_completion({"prompt": ["Once"], "max_tokens": 4}, DEFAULTS, Limits(), "m")
    assert job.prompt == "Once" and job.endpoint == "completion" and job.max_tokens == 4
    job = parse_completion({"prompt": ["a", "b"], "suffix": "}", "echo": True}, DEFAULTS, Limits(), "m")
    assert job.prompts == ("a", "b") and job.prompt == "a" and job.suffix == "}" and job.echo
    for body in (
        {"prompt": [1, 2]},
        {"prompt": []},
        {"prompt": ["x"] * 17},
        {"prompt": "x", "suffix": 3},
        {"prompt": "x", "echo": "yes"},
        {"prompt": "x", "best_of": 2},
        {"prompt": "x", "messages": USER},
    ):
        with pytest.raises(ApiError) as caught:
            parse_completion(body, DEFAULTS, Limits(), "m")
        assert caught.value.status == 400 and "\n" not in caught.value.message


def _mutate(rng: random.Random, value: Any, depth: int = 0) -> Any:
    choices: list[Any] = [
        None, True, -1, 0, 2**63, -(2**70), 1e308, -0.0, 0.5, "", "x" * rng.randint(0, 300), "\ud83d", [], {},
        [1, "a", None], {"type": "text"}, {"role": "user"},
    ]  # fmt: skip
    if depth < 3 and isinstance(value, dict) and value and rng.random() < 0.7:
        key = rng.choice(sorted(value))
        return {**value, key: _mutate(rng, value[key], depth + 1)}
    if depth < 3 and isinstance(value, list) and value and rng.random() < 0.7:
        i = rng.randrange(len(value))
        return [*value[:i], _mutate(rng, value[i], depth + 1), *value[i + 1 :]]
    return rng.choice(choices)


def test_fuzzed_bodies_are_answered_or_refused_never_crash() -> None:
    """2,000 mutations of a full request: each parses or is an ApiError (no other exception, no hang)."""
    base: dict[str, Any] = json.loads(
        json.dumps(
            {
                "messages": [
                    {"role": "system", "content": "s"},
                    {"role": "user", "content": [{"type": "text", "text": "t"}]},
                ],
                "temperature": 0.2,
                "max_tokens": 5,
                "stop": ["x"],
                "stream": True,
                "stream_options": {"include_usage": True},
                "speculative": {"type": ["ngram-simple"], "n_max": 4},
                "control_vectors": [{"name": "v", "strength": 1.0, "layers": [1, 2]}],
                "chat_template_kwargs": {"enable_thinking": True},
            }
        )
    )
    rng = random.Random(33)
    outcomes = {"ok": 0, "refused": 0}
    for _ in range(2000):
        body = _mutate(rng, base)
        if rng.random() < 0.3:
            body = _mutate(rng, body)
        try:
            chat(body)
            outcomes["ok"] += 1
        except ApiError as e:
            assert 400 <= e.status < 500 and "\n" not in e.message
            outcomes["refused"] += 1
    assert outcomes["ok"] > 100 and outcomes["refused"] > 100


def test_reasoning_effort_and_budget_per_request_under_llama_servers_names() -> None:
    job = chat({"messages": USER, "reasoning_effort": "low", "thinking_budget_tokens": 64})
    assert job.reasoning_effort == "low" and job.reasoning_budget == 64 and job.enable_thinking is None
    job = chat({"messages": USER, "reasoning_budget_tokens": 0, "reasoning_budget_message": "Enough."})
    assert job.reasoning_budget == 0 and job.reasoning_budget_message == "Enough."
    assert chat({"messages": USER, "reasoning_budget": 5, "thinking_budget_tokens": 5}).reasoning_budget == 5
    none = chat({"messages": USER, "reasoning_effort": "none"})
    assert none.reasoning_effort is None and none.enable_thinking is False
    plain = chat({"messages": USER})
    assert plain.reasoning_effort is None and plain.reasoning_budget == -1 and plain.reasoning_budget_message == ""
    assert refused({"messages": USER, "reasoning_effort": "max"}).param == "reasoning_effort"
    assert refused({"messages": USER, "thinking_budget_tokens": -2}).param == "thinking_budget_tokens"
    assert refused({"messages": USER, "reasoning_budget": 3, "thinking_budget_tokens": 4}).param == "reasoning_budget"
    assert refused({"messages": USER, "reasoning_budget_message": 7}).param == "reasoning_budget_message"
    assert refused({"messages": USER, "reasoning_budget_message": "x" * 1001}).param == "reasoning_budget_message"


def test_image_url_parts_take_data_urls_only_and_checked_images() -> None:
    import base64
    import hashlib

    from engine_ext.protocol import IMAGE_MARKER
    from tests.tiny_mmproj import png_bytes

    png = png_bytes(8, 6)
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    parts = [
        {"type": "text", "text": "left "},
        {"type": "image_url", "image_url": {"url": url}},
        {"type": "text", "text": " right"},
    ]
    job = chat({"messages": [{"role": "user", "content": parts}]})
    message = job.messages[-1]
    assert message.content == f"left {IMAGE_MARKER} right"
    assert [i.sha256 for i in message.images] == [hashlib.sha256(png).hexdigest()] and message.images[0].data == png
    for image_url, why in (
        ({"url": "https://example.com/cat.png"}, "remote image URLs are not fetched"),
        ({"url": "file:///etc/passwd"}, "not a data: URL"),
        ({"url": "data:image/png;base64,@@@"}, "not valid base64"),
        ({"url": "data:image/png;base64," + base64.b64encode(b"GIF89a\xff\xff\xff\xff;").decode()}, "more than"),
        ({"url": "data:image/png;base64," + base64.b64encode(b"not an image").decode()}, "not an image"),
    ):
        body = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": image_url}]}]}
        assert why in refused(body).message


def test_openai_fields_that_change_nothing_here_are_taken_and_checked() -> None:
    job = chat(
        {
            "messages": USER,
            "prompt_cache_key": "k",
            "safety_identifier": "s",
            "verbosity": "low",
            "modalities": ["text"],
            "prediction": {"type": "content", "content": "x"},
            "web_search_options": {},
            "prompt_cache_retention": "24h",
            "audio": None,
            "store": False,
            "metadata": {"a": "b"},
            "service_tier": "auto",
            "user": "u",
            "parallel_tool_calls": True,
            "stream_options": None,
        }
    )
    assert job.messages[0].content == "hi"
    assert "text only" in refused({"messages": USER, "modalities": ["text", "audio"]}).message
    assert "no audio" in refused({"messages": USER, "audio": {"voice": "alloy", "format": "wav"}}).message
    assert refused({"messages": USER, "prompt_cache_key": 3}).param == "prompt_cache_key"
    assert refused({"messages": USER, "store": "yes"}).param == "store"


def test_tool_choice_null_is_auto_and_legacy_functions_are_tools() -> None:
    tool = {"name": "f", "parameters": {"type": "object", "properties": {}}}
    job = chat({"messages": USER, "tools": [{"type": "function", "function": tool}], "tool_choice": None})
    assert job.tool_choice == "auto" and job.tools is not None and json.loads(job.tools)[0]["function"]["name"] == "f"
    job = chat({"messages": USER, "functions": [tool], "function_call": {"name": "f"}})
    assert job.tool_choice == "required" and json.loads(job.tools or "")[0]["function"]["name"] == "f"
    assert chat({"messages": USER, "functions": [tool], "function_call": "none"}).tool_choice == "none"
    assert chat({"messages": USER, "functions": [tool]}).tool_choice == "auto"
    assert "not both" in refused({"messages": USER, "functions": [tool], "tools": []}).message
    assert refused({"messages": USER, "function_call": "auto"}).param == "function_call"
    assert refused({"messages": USER, "functions": [tool], "function_call": "always"}).param == "function_call"
    assert refused({"messages": USER, "functions": {"name": "f"}}).param == "functions"


def test_text_parts_are_joined_by_a_newline_as_upstream_joins_them() -> None:
    parts = [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}, {"type": "text", "text": ""}]
    assert chat({"messages": [{"role": "user", "content": parts}]}).messages[0].content == "one\ntwo\n"


def test_n_predict_is_max_tokens() -> None:
    assert chat({"messages": USER, "n_predict": 7}).max_tokens == 7
    assert chat({"messages": USER, "n_predict": 7, "max_tokens": 3}).max_tokens == 3
    assert chat({"messages": USER, "n_predict": -1}).max_tokens == -1
    assert refused({"messages": USER, "n_predict": 0}).param == "n_predict"
    assert parse_completion({"prompt": "a", "n_predict": 5}, DEFAULTS, LIMITS, "m").max_tokens == 5


def test_llama_servers_sampling_fields_are_taken_and_checked() -> None:
    job = chat(
        {
            "messages": USER,
            "typical_p": 0.5,
            "mirostat": 2,
            "mirostat_tau": 4.0,
            "mirostat_eta": 0.2,
            "dry_multiplier": 0.8,
            "dry_base": 1.5,
            "dry_allowed_length": 3,
            "dry_penalty_last_n": 128,
            "dry_sequence_breakers": ["\n", "###"],
            "xtc_probability": 0.3,
            "xtc_threshold": 0.2,
            "top_n_sigma": 1.5,
            "samplers": ["top_k", "typical_p", "temp"],
            "min_keep": 0,
        }
    )
    p = job.sampling
    assert (p.typical_p, p.mirostat, p.mirostat_tau, p.mirostat_eta) == (0.5, 2, 4.0, 0.2)
    assert (p.dry_multiplier, p.dry_base, p.dry_allowed_length, p.dry_penalty_last_n) == (0.8, 1.5, 3, 128)
    assert p.dry_sequence_breakers == ("\n", "###") and (p.xtc_probability, p.xtc_threshold) == (0.3, 0.2)
    assert p.top_n_sigma == 1.5 and p.samplers == ("top_k", "typ_p", "temperature")
    assert chat({"messages": USER, "samplers": "kpt"}).sampling.samplers == ("top_k", "top_p", "temperature")
    assert chat({"messages": USER}).sampling.samplers[0] == "penalties"  # llama.cpp's order when not given
    for body, field in (
        ({"mirostat": 3}, "mirostat"),
        ({"typical_p": 1.5}, "typical_p"),
        ({"dry_penalty_last_n": -1}, "dry_penalty_last_n"),
        ({"dry_sequence_breakers": []}, "dry_sequence_breakers"),
        ({"dry_sequence_breakers": [3]}, "dry_sequence_breakers"),
        ({"samplers": ["top_k", "magic"]}, "samplers"),
        ({"samplers": "kz"}, "samplers"),
        ({"dynatemp_range": 0.5}, "dynatemp_range"),
        ({"min_keep": 4}, "min_keep"),
    ):
        assert refused({"messages": USER, **body}).param == field, body


def test_n_above_one_is_refused_saying_what_the_server_does() -> None:
    """Issue 49 item 19: `n: 2` was refused as "n must be between 1 and 1"."""
    message = refused({"messages": USER, "n": 2}).message
    assert message == (
        "n = 2 is not supported: this server writes one choice per request (n = 1); send the request 2 times for 2 "
        "choices"
    )
    assert refused({"messages": USER, "n": 0}).param == "n"


def test_a_slot_id_is_one_of_the_servers_sequences() -> None:
    assert [slot_id("0", 1), slot_id("1", 2), slot_id("3", 4)] == [0, 1, 3]
    for text, n_slots in (("1", 1), ("2", 2), ("-1", 2), ("x", 2), ("", 2), ("١", 2), ("9" * 30, 2)):
        with pytest.raises(ApiError) as refused:
            slot_id(text, n_slots)
        assert refused.value.status == 400 and "\n" not in str(refused.value)
        assert ("one slot, 0" if n_slots == 1 else f"slots 0 to {n_slots - 1}") in str(refused.value)
