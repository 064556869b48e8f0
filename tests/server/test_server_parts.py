"""The server's parts without a socket: tool calls found in model output (whole and streamed a character at a
time), request bodies read within their limits and mapped onto generation options, the Prometheus text."""

from __future__ import annotations

import json
import re

import pytest

from strata.generation import Stats
from strata.server.body import MAX_CONTAINERS, read_json
from strata.server.metrics import Metrics
from strata.server.pool import SessionPool
from strata.server.requests import BadRequest, parse_chat, parse_completion
from strata.server.tools import ToolCallStream, split_tool_calls

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>'


def test_tool_calls_become_openai_tool_calls():
    content, calls = split_tool_calls("Let me look.\n" + CALL + "\n" + CALL.replace("Paris", "Oslo"))
    assert content == "Let me look."
    assert [c["function"]["name"] for c in calls] == ["get_weather"] * 2
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"city": "Paris", "days": 2},
                                                                       {"city": "Oslo", "days": 2}]
    assert len({c["id"] for c in calls}) == 2 and all(c["type"] == "function" for c in calls)


@pytest.mark.parametrize("text", ["no call here", "<tool_call>not json</tool_call>",
                                  '<tool_call>{"arguments": {}}</tool_call>', "<tool_call>{\"name\": \"f\"",
                                  "a < b and <tool_ca"])
def test_text_that_is_not_a_call_stays_text(text):
    assert split_tool_calls(text) == (text, [])


@pytest.mark.parametrize("prefix", ["", "Checking: ", "a <b> c "])
def test_a_streamed_call_is_held_back_and_the_text_before_it_shown(prefix):
    stream = ToolCallStream()
    shown = "".join(stream.push(ch) for ch in prefix + CALL)
    assert shown == prefix
    rest, calls = stream.finish()
    assert rest == "" and json.loads(calls[0]["function"]["arguments"])["city"] == "Paris"


def test_streamed_text_with_a_false_start_is_shown_whole():
    stream = ToolCallStream()
    text = "x <tool_c y"
    shown = "".join(stream.push(ch) for ch in text)
    rest, calls = stream.finish()
    assert shown + rest == text and calls == []


def test_a_body_holds_at_most_max_containers_arrays_and_objects_brackets_in_strings_not_counted():
    def lists(count: int) -> str:
        return "[" + "[]," * (count - 2) + "{}]"

    assert len(read_json(lists(MAX_CONTAINERS).encode())) == MAX_CONTAINERS - 1
    with pytest.raises(BadRequest, match=f"holds {MAX_CONTAINERS + 1} arrays and objects; at most "):
        read_json(lists(MAX_CONTAINERS + 1).encode())
    text = "a[b]{c} \\\"[" * MAX_CONTAINERS  # brackets, escaped quotes and backslashes, all inside one string
    body = {"prompt": text, "stop": [["x"]]}
    assert read_json(json.dumps(body).encode()) == body
    with pytest.raises(BadRequest, match="messages\\[0\\].tool_calls: the arguments' text holds 70001 arrays"):
        parse_chat({"messages": [{"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "f", "arguments": "[" + "{}," * 69_999 + "{}]"}}]}]})
    assert read_json(b'\xef\xbb\xbf{"a": 1}') == {"a": 1}  # a UTF-8 BOM, as json.loads took it
    with pytest.raises(BadRequest, match="is not valid UTF-8"):
        read_json('{"a": "\u00e9"}'.encode("utf-16"))


@pytest.mark.parametrize("raw, param, where", [
    (b'{"messages": [{"role": "user", "content": "\\ud800"}]}', "messages[0].content", "messages[0].content"),
    (b'{"messages": [{"role": "user", "content": "hi", "\\ud83d": 1}]}', "messages[0]", "a key of messages[0]"),
    (b'{"a": ["x", {"b": ["ok", "\\udc00"]}]}', "a[1].b[1]", "a[1].b[1]"),
    (b'"\\udfff"', None, "the body"),
])
def test_a_string_that_is_not_whole_unicode_is_refused_naming_where_it_is(raw, param, where):
    said = rf"lone UTF-16 surrogate \(\\u[0-9a-f]{{4}}\) in {re.escape(where)}:"
    with pytest.raises(BadRequest, match=said) as refused:
        read_json(raw)
    assert refused.value.param == param


def test_request_bodies_map_onto_generation_options():
    call = parse_chat({"model": "m", "messages": [{"role": "developer", "content": [{"type": "text", "text": "a"},
                                                                                    {"type": "text", "text": "b"}]},
                                                  {"role": "user", "content": "hi"}],
                       "temperature": 0.5, "top_p": 0.9, "top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1,
                       "seed": 3, "stop": "END", "max_completion_tokens": 7, "logprobs": True, "top_logprobs": 2,
                       "stream": True, "stream_options": {"include_usage": True},
                       "chat_template_kwargs": {"enable_thinking": False}})
    assert call.messages[0] == {"role": "system", "content": "ab"}
    assert call.generate_options() == {"temperature": 0.5, "top_p": 0.9, "top_k": 20, "min_p": 0.05,
                                       "repeat_penalty": 1.1, "frequency_penalty": 0.0, "presence_penalty": 0.0,
                                       "logit_bias": {}, "seed": 3, "stop": ["END"], "ignore_eos": False,
                                       "max_tokens": 7, "logprobs": 2}
    assert call.stream and call.include_usage and call.template_options == {"enable_thinking": False}
    assert parse_chat({"messages": [{"role": "user", "content": "hi"}]}).generate_options()["max_tokens"] is None
    assert parse_completion({"prompt": "hi"}).max_tokens == 16  # OpenAI's default for completions


def test_openai_and_llama_server_spellings_map_onto_the_same_options():
    call = parse_completion({"prompt": ["a", [1, 2]], "n": 3, "seed": 10, "n_predict": 5, "repeat_penalty": 1.2,
                             "ignore_eos": True, "logit_bias": [[7, -3], [9, 2.5]], "frequency_penalty": 0.5,
                             "presence_penalty": -0.5, "cache_prompt": True, "store": True,
                             "metadata": {"k": "v"}})
    assert call.prompts == ["a", [1, 2]] and call.n == 3 and call.answers == 6
    assert [call.generate_options(i)["seed"] for i in range(6)] == [10, 11, 12, 10, 11, 12]
    options = call.generate_options()
    assert (options["max_tokens"], options["repeat_penalty"], options["ignore_eos"]) == (5, 1.2, True)
    assert options["logit_bias"] == {7: -3.0, 9: 2.5}
    assert (options["frequency_penalty"], options["presence_penalty"]) == (0.5, -0.5)
    assert parse_completion({"prompt": "a", "logit_bias": {"7": -3}}).sampling["logit_bias"] == {7: -3.0}
    assert parse_completion({"prompt": "a", "n_predict": -1}).max_tokens is None
    assert parse_completion({"prompt": "a", "n": 2, "seed": -1}).generate_options(1)["seed"] == -1  # random


def test_tools_reach_the_template_unless_turned_off():
    tools = [{"type": "function", "function": {"name": "f"}}]
    body = {"messages": [{"role": "user", "content": "hi"}], "tools": tools}
    assert parse_chat(body).template_options == {"tools": tools}
    assert parse_chat({**body, "tool_choice": "none"}).tools is None
    required = parse_chat({**body, "tool_choice": "required"})
    assert required.constraint.field == "tool_choice" and required.template_options == {"tools": tools}
    named = parse_chat({**body, "tool_choice": {"type": "function", "function": {"name": "f"}}}).constraint
    assert named.kind == "lark" and '{"const": "f"}' in named.source
    with pytest.raises(BadRequest, match="no tool named") as refused:
        parse_chat({**body, "tool_choice": {"type": "function", "function": {"name": "g"}}})
    assert refused.value.param == "tool_choice"
    with pytest.raises(BadRequest, match="gives no 'tools'"):
        parse_chat({"messages": body["messages"], "tool_choice": "required"})


def test_an_assistant_tool_call_reaches_the_template_with_arguments_as_an_object():
    body = {"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}]}]}
    message = parse_chat(body).messages[0]
    assert message["tool_calls"][0]["function"]["arguments"] == {"x": 1} and message["content"] == ""
    assert body["messages"][0]["tool_calls"][0]["function"]["arguments"] == '{"x": 1}'  # the body is not changed


def samples(text: str) -> dict[str, float]:
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line and not line.startswith("#")}


def test_metrics_speak_prometheus_text():
    metrics = Metrics()
    metrics.answered("/v1/chat/completions", 200, Stats(prompt_tokens=10, cached_tokens=4, generated_tokens=5,
                                                        prefill_seconds=0.5, decode_seconds=0.1,
                                                        finish_reason="eos", steps=2, drafted=6, accepted=3))
    metrics.answered("/v1/completions", 200, Stats(generated_tokens=1, finish_reason="length", drafted=2))
    metrics.answered("/v1/chat/completions", 429)
    metrics.timed(0.5, [0.004, 0.004, 0.02])
    metrics.timed(None, [])
    text = metrics.text(SessionPool([object(), object()], 4))
    lines = samples(text)
    assert lines['strata_requests_total{endpoint="/v1/chat/completions",status="200"}'] == 1
    assert lines['strata_requests_total{endpoint="/v1/chat/completions",status="429"}'] == 1
    assert lines["strata_prompt_tokens_total"] == 10 and lines["strata_cached_prompt_tokens_total"] == 4
    assert lines["strata_generated_tokens_total"] == 6 and lines["strata_sessions"] == 2
    assert lines["strata_drafted_tokens_total"] == 8 and lines["strata_accepted_tokens_total"] == 3
    assert lines["strata_decode_tokens_per_second"] == pytest.approx(40.0)
    assert lines["strata_time_to_first_token_seconds_sum"] == 0.5
    assert lines["strata_time_to_first_token_seconds_count"] == 1
    assert lines["strata_inter_token_latency_seconds_count"] == 3
    assert lines["strata_queue_depth"] == 0 and lines["strata_busy_sessions"] == 0
    # every sample has its HELP and TYPE
    names = {key.split("{")[0].removesuffix("_sum").removesuffix("_count").removesuffix("_bucket") for key in lines}
    assert all(f"# TYPE {name} " in text and f"# HELP {name} " in text for name in names)


def test_histograms_keep_prometheus_conventions():
    """_bucket samples cumulative in le order (an observation equal to a bound counts in its bucket), ending at
    +Inf equal to _count; _sum the observations' sum; seconds as the unit of time."""
    metrics = Metrics()
    for depth in (0, 0, 1, 3, 200):
        metrics.arrived(depth)
    metrics.timed(0.05, [0.001, 0.0025, 0.003, 2.0])

    class Batcher:
        max_batch = 8

        @staticmethod
        def stats():
            return {"decode_batches": 7, "decode_rows": 30, "prompt_chunks": 2, "calls": 0, "busy_seconds": 1.5,
                    "gathering_seconds": 0.25, "batch_sizes": {1: 2, 4: 1, 8: 3}, }

    text = metrics.text(SessionPool([object()], 4), Batcher())
    lines = samples(text)
    for name, bounds_seen in (("strata_inter_token_latency_seconds", 14), ("strata_queue_depth_on_arrival", 9),
                              ("strata_time_to_first_token_seconds", 12), ("strata_decode_batch_rows", 7)):
        assert f"# TYPE {name} histogram" in text
        buckets = [(key, value) for key, value in lines.items() if key.startswith(name + "_bucket{")]
        assert len(buckets) == bounds_seen + 1 and buckets[-1][0] == name + '_bucket{le="+Inf"}'
        counts = [value for _, value in buckets]
        assert counts == sorted(counts) and counts[-1] == lines[name + "_count"]
        bounds = [float(key.split('"')[1]) for key, _ in buckets]
        assert bounds == sorted(bounds)
    assert lines['strata_inter_token_latency_seconds_bucket{le="0.001"}'] == 1
    assert lines['strata_inter_token_latency_seconds_bucket{le="0.0025"}'] == 2
    assert lines['strata_inter_token_latency_seconds_bucket{le="0.005"}'] == 3
    assert lines['strata_inter_token_latency_seconds_bucket{le="1.0"}'] == 3
    assert lines["strata_inter_token_latency_seconds_sum"] == pytest.approx(2.0065)
    assert lines['strata_queue_depth_on_arrival_bucket{le="0"}'] == 2
    assert lines['strata_queue_depth_on_arrival_bucket{le="4"}'] == 4
    assert lines['strata_queue_depth_on_arrival_bucket{le="128"}'] == 4
    assert lines["strata_queue_depth_on_arrival_count"] == 5 and lines["strata_queue_depth_on_arrival_sum"] == 204
    assert lines['strata_decode_batch_rows_bucket{le="1"}'] == 2 and lines['strata_decode_batch_rows_bucket{le="4"}'] == 3
    assert lines["strata_decode_batch_rows_sum"] == 30 and lines["strata_decode_batch_rows_count"] == 6
    assert lines["strata_compute_busy_seconds_total"] == 1.5
    assert lines["strata_compute_gathering_seconds_total"] == 0.25
