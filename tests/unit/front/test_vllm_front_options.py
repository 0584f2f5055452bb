"""The front options that `vllm serve`'s flags set on `--source vllm` (engine/vllm_flags.py), in a real front: any of
several API keys, model aliases, max_tokens left to the engine's default (HTTPS: tests/e2e/test_service.py); and
vLLM's other endpoints and headers: /ping, /invocations, /version, X-Vllm-Priority; the engine's system_fingerprint
where vLLM's server writes it; the answer's role (--response-role); a path prefix (--root-path)."""

from __future__ import annotations

import json
import logging
import re
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from helpers.bus_rows import text_batch
from helpers.front_harness import PLAYED_WORKER, decode_plan, running_front

from detok_worker.bus.codec import encode
from detok_worker.bus.messages import Submit
from detok_worker.config import ConfigError, load_config

CHAT = {"messages": [{"role": "user", "content": "Hi"}]}


def next_submit(front: Any) -> Submit:
    return front.engine.submits.get(timeout=10)


def test_any_of_several_keys_is_accepted_and_no_other(qwen3: Any) -> None:
    with running_front(qwen3, **{"front.api_keys": ["key-one", "key-two"]}) as front:
        statuses = [
            httpx.get(f"{front.url}/v1/models", headers=headers).status_code
            for headers in (
                {},
                {"Authorization": "Bearer key-one"},
                {"Authorization": "Bearer key-two"},
                {"Authorization": "Bearer key-three"},
                {"Authorization": "Basic key-one"},
            )
        ]
    assert statuses == [401, 200, 200, 401, 401]


def test_an_alias_is_accepted_and_the_served_name_answers(qwen3: Any) -> None:
    with running_front(qwen3, **{"front.model_name": "first", "front.model_aliases": ["second"]}) as front:
        listed = [card["id"] for card in httpx.get(f"{front.url}/v1/models").json()["data"]]
        body = {"prompt": "Hi", "max_tokens": 2}
        by_alias = httpx.post(f"{front.url}/v1/completions", json={**body, "model": "second"}, timeout=30)
        unknown = httpx.post(f"{front.url}/v1/completions", json={**body, "model": "third"}, timeout=30)
        card = httpx.get(f"{front.url}/v1/models/second").json()
    assert listed == ["first", "second"]
    assert by_alias.status_code == 200 and by_alias.json()["model"] == "first"
    assert unknown.status_code == 404
    assert (card["id"], card["root"]) == ("second", "first")
    assert card["owned_by"] == "detok" and "permission" not in card  # vLLM's card is on --source vllm only


def test_the_model_cards_on_the_vllm_source_are_vllms(qwen3: Any) -> None:
    """vLLM's /v1/models (openai/models/serving.py): every served name's root is the model it loaded, and every
    card, an adapter's too, is owned by "vllm", made now, with one ModelPermission of vLLM's defaults."""
    options = {
        "engine.source": "vllm",
        "engine.model": "/models/qwen3",
        "front.model_name": "base",
        "front.model_aliases": ["alias"],
        "front.lora_adapters": {"adapter": "/adapters/a"},
    }
    with running_front(qwen3, **options) as front:
        cards = httpx.get(f"{front.url}/v1/models").json()["data"]
        alias = httpx.get(f"{front.url}/v1/models/alias").json()
    assert [(c["id"], c["owned_by"], c["root"], c["parent"]) for c in cards] == [
        ("base", "vllm", "/models/qwen3", None),
        ("alias", "vllm", "/models/qwen3", None),
        ("adapter", "vllm", "/adapters/a", "base"),
    ]
    assert alias == {**cards[1], "created": alias["created"], "permission": alias["permission"]}
    assert list(cards[0]) == ["id", "object", "created", "owned_by", "root", "parent", "max_model_len", "permission"]
    assert all(abs(card["created"] - time.time()) < 60 for card in cards)
    assert [len(card["permission"]) for card in cards] == [1, 1, 1]
    permission = cards[0]["permission"][0]
    assert re.fullmatch(r"modelperm-[0-9a-f]{16}", permission.pop("id"))
    assert abs(permission.pop("created") - time.time()) < 60
    assert permission == {
        "object": "model_permission",
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }


def test_an_omitted_max_tokens_is_left_to_the_engine_and_completions_default_to_16(qwen3: Any) -> None:
    options = {
        "engine.source": "vllm",
        "engine.model": "m",
        "front.max_tokens_default": 0,
        "front.completions_max_tokens_default": 16,
        "front.max_tokens_limit": 100_000,
    }
    with running_front(qwen3, **options) as front:
        for body in ({**CHAT}, {**CHAT, "max_tokens": 40}, {"prompt": "Hi"}, {"prompt": "Hi", "max_tokens": 50_000}):
            path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
            assert httpx.post(f"{front.url}{path}", json=body, timeout=30).status_code == 200
        seen = [(s.params.max_tokens, s.params.engine_max_tokens) for s in (next_submit(front) for _ in range(4))]
    assert seen == [(100_000, True), (40, False), (16, False), (50_000, False)]


def test_several_greedy_choices_are_refused_on_the_vllm_source_only(qwen3: Any) -> None:
    """vLLM's SamplingParams: "n must be 1 when using greedy sampling" (a 400); other engines sample them all."""
    statuses = {}
    for source in ("vllm", "echo"):
        vllm_options = {"engine.model": "m"} if source == "vllm" else {}
        with running_front(qwen3, **{"engine.source": source, **vllm_options}) as front:
            for temperature in (0, 0.5):
                body = {**CHAT, "max_tokens": 2, "n": 2, "temperature": temperature}
                answer = httpx.post(f"{front.url}/v1/chat/completions", json=body, timeout=30)
                statuses[source, temperature] = (answer.status_code, answer.json().get("error", {}).get("param"))
    assert statuses == {("vllm", 0): (400, "n"), ("vllm", 0.5): (200, None), ("echo", 0): (200, None),
                        ("echo", 0.5): (200, None)}  # fmt: skip


def test_ping_answers_as_health_with_no_body(qwen3: Any) -> None:
    with running_front(qwen3) as front:
        answers = [httpx.request(method, f"{front.url}/ping") for method in ("GET", "POST")]
    assert [(answer.status_code, answer.content) for answer in answers] == [(200, b""), (200, b"")]


def test_ping_says_503_without_an_engine(qwen3: Any) -> None:
    with running_front(qwen3, send_stats=False) as front:
        assert httpx.get(f"{front.url}/ping").status_code == 503


def test_invocations_route_by_body_and_need_the_key(qwen3: Any) -> None:
    with running_front(qwen3, **{"front.api_keys": ["k"]}) as front:
        key = {"Authorization": "Bearer k"}
        chat = httpx.post(f"{front.url}/invocations", json={**CHAT, "max_tokens": 3}, headers=key, timeout=30)
        completion = httpx.post(
            f"{front.url}/invocations", json={"prompt": "Hi there", "max_tokens": 3}, headers=key, timeout=30
        )
        without_key = httpx.post(f"{front.url}/invocations", json={"prompt": "Hi", "max_tokens": 3}, timeout=30)
        bad = httpx.post(f"{front.url}/invocations", content=b"{not json", headers=key, timeout=30)
    assert chat.status_code == 200 and chat.json()["object"] == "chat.completion"
    assert completion.status_code == 200 and completion.json()["object"] == "text_completion"
    assert without_key.status_code == 401
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_json"


def test_version_gives_the_engines_version_and_detoks(qwen3: Any) -> None:
    with running_front(qwen3, send_stats=False) as front:
        before = httpx.get(f"{front.url}/version").json()
        front.engine.engine_version = "0.32.0"
        front.engine.send_stats = True
        front.wait_healthy()
        after = httpx.get(f"{front.url}/version").json()
    assert before["version"] == before["detok_version"] != "0.32.0"
    assert after == {"version": "0.32.0", "detok_version": before["detok_version"]}


def test_the_priority_header_overrides_the_bodys_priority(qwen3: Any) -> None:
    options = {"engine.source": "vllm", "engine.model": "m"}
    with running_front(qwen3, **options) as front:
        body = {"prompt": "Hi", "max_tokens": 2, "priority": 3}
        for header in ("-5", "not a number", None):
            headers = {"X-Vllm-Priority": header} if header is not None else {}
            assert httpx.post(f"{front.url}/v1/completions", json=body, headers=headers, timeout=30).status_code == 200
        priorities = [next_submit(front).params.priority for _ in range(3)]
    assert priorities == [-5, 3, 3]


def test_the_session_header_gives_a_session_id_to_a_request_without_one(qwen3: Any) -> None:
    """vLLM's X-Session-ID: the session_id of a request whose body gives none (the body's wins); on another engine
    source the header is a hint passed over, while the body's field is refused by name."""
    with running_front(qwen3, **{"engine.source": "vllm", "engine.model": "m"}) as front:
        body = {"prompt": "Hi", "max_tokens": 2}
        for extra, headers in (
            ({}, {"X-Session-ID": "conv-1"}),
            ({"session_id": "own"}, {"X-Session-ID": "x"}),
            ({}, {}),
        ):
            answer = httpx.post(f"{front.url}/v1/completions", json={**body, **extra}, headers=headers, timeout=30)
            assert answer.status_code == 200, answer.text
        sessions = [next_submit(front).params.session_id for _ in range(3)]
    assert sessions == ["conv-1", "own", None]
    with running_front(qwen3) as front:
        hinted = httpx.post(f"{front.url}/v1/completions", json=body, headers={"X-Session-ID": "c"}, timeout=30)
        field = httpx.post(f"{front.url}/v1/completions", json={**body, "session_id": "c"}, timeout=30)
    assert hinted.status_code == 200 and next_submit(front).params.session_id is None
    assert field.status_code == 400 and field.json()["error"]["param"] == "session_id"


def test_server_chat_template_kwargs_go_under_the_requests(qwen3: Any) -> None:
    """Qwen3's template: enable_thinking false closes an empty think block in the prompt."""
    with running_front(qwen3, **{"front.chat_template_kwargs": {"enable_thinking": False}}) as front:
        for extra in ({}, {"chat_template_kwargs": {"enable_thinking": True}}):
            assert httpx.post(f"{front.url}/v1/chat/completions", json={**CHAT, "max_tokens": 1, **extra}).is_success
        server_default, request_wins = (qwen3.decode(next_submit(front).prompt_ids) for _ in range(2))
    assert server_default.endswith("<think>\n\n</think>\n\n")
    assert "<think>" not in request_wins


def test_forced_usage_ends_every_stream_with_usage(qwen3: Any) -> None:
    body = {"prompt": "Hi there", "max_tokens": 3, "stream": True}
    usages = []
    for forced in (False, True):
        with running_front(qwen3, **{"front.force_include_usage": forced}) as front:
            with httpx.stream("POST", f"{front.url}/v1/completions", json=body, timeout=30) as response:
                events = [line[6:] for line in response.iter_lines() if line.startswith("data: {")]
            usages.append([json.loads(event).get("usage") for event in events])
    unforced, forced_usage = usages
    assert all(usage is None for usage in unforced)
    assert forced_usage[-1] is not None and forced_usage[-1]["completion_tokens"] > 0
    # vLLM's --enable-force-include-usage also turns the running usage on: every chunk carries its choice's counts
    assert all(usage is not None for usage in forced_usage[:-1])
    assert forced_usage[-2]["completion_tokens"] == forced_usage[-1]["completion_tokens"]


def stream_usages(front: Any, body: dict[str, Any]) -> list[tuple[dict[str, Any], Any]]:
    """Each streamed chat chunk's first choice delta (None on the usage chunk) and its usage."""
    with httpx.stream("POST", f"{front.url}/v1/chat/completions", json=body, timeout=30) as response:
        assert response.status_code == 200, response.read()
        chunks = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
    return [(chunk["choices"][0]["delta"] if chunk["choices"] else None, chunk.get("usage")) for chunk in chunks]


def test_running_usage_counts_no_tokens_before_the_output_and_is_a_no_op_without_include_usage(qwen3: Any) -> None:
    """vLLM's rule: continuous_usage_stats gives every chunk its choice's running usage with include_usage (the
    role chunk, sent before any output, counts none), and alone does nothing (a 200 with no usage)."""
    body = {**CHAT, "max_tokens": 3, "stream": True}
    with running_front(qwen3) as front:
        both = {"include_usage": True, "continuous_usage_stats": True}
        running = stream_usages(front, {**body, "stream_options": both})
        alone = stream_usages(front, {**body, "stream_options": {"continuous_usage_stats": True}})
    (role, first), *_, (_, last) = running
    assert role.get("role") == "assistant" and first["completion_tokens"] == 0
    assert first["total_tokens"] == first["prompt_tokens"] > 0 and last["completion_tokens"] > 0
    assert alone and all(usage is None for _, usage in alone)


def test_openapi_off_is_a_404(qwen3: Any) -> None:
    with running_front(qwen3, **{"front.openapi": False}) as front:
        assert httpx.get(f"{front.url}/openapi.json").status_code == 404


def test_logged_requests_show_their_params_and_at_most_max_log_len_prompt_ids(
    qwen3: Any, caplog: pytest.LogCaptureFixture
) -> None:
    prompt = list(range(1000, 1010))
    options = {"front.log_requests": True, "front.max_log_len": 4}
    with caplog.at_level(logging.INFO, logger="detok.requests"), running_front(qwen3, **options) as front:
        body = {"prompt": prompt, "max_tokens": 2, "seed": 7}
        assert httpx.post(f"{front.url}/v1/completions", json=body, timeout=30).status_code == 200
        rid = next_submit(front).rid
    lines = [record.getMessage() for record in caplog.records if record.name == "detok.requests"]
    assert len(lines) == 1
    assert lines[0].startswith(f"request {rid}: params RequestParams(max_tokens=2,")
    assert "seed=7" in lines[0]
    assert lines[0].endswith("prompt_token_ids [1000, 1001, 1002, 1003] ... (10 ids)")


def test_requests_are_not_logged_by_default(qwen3: Any, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="detok.requests"), running_front(qwen3) as front:
        assert httpx.post(f"{front.url}/v1/completions", json={"prompt": "Hi", "max_tokens": 2}).is_success
    assert not [record for record in caplog.records if record.name == "detok.requests"]


def test_a_lora_adapter_is_a_model_whose_requests_run_on_it(qwen3: Any) -> None:
    options = {"engine.source": "vllm", "engine.model": "m", "front.model_name": "base"}
    with running_front(qwen3, **options, **{"front.lora_adapters": {"adapter": "/adapters/a"}}) as front:
        cards = httpx.get(f"{front.url}/v1/models").json()["data"]
        card = httpx.get(f"{front.url}/v1/models/adapter").json()
        body = {"prompt": "Hi", "max_tokens": 2}
        on_adapter = httpx.post(f"{front.url}/v1/completions", json={**body, "model": "adapter"}, timeout=30)
        on_base = httpx.post(f"{front.url}/v1/completions", json={**body, "model": "base"}, timeout=30)
        loras = [next_submit(front).params.lora for _ in range(2)]
    assert [(c["id"], c["root"], c["parent"]) for c in cards] == [
        ("base", "m", None),  # vLLM's root: the model it loaded (--model)
        ("adapter", "/adapters/a", "base"),
    ]
    assert card["id"] == "adapter" and card["parent"] == "base"
    assert on_adapter.json()["model"] == "adapter" and on_base.json()["model"] == "base"
    assert loras == ["adapter", ""]


def test_lora_adapters_need_the_vllm_source() -> None:
    with pytest.raises(ConfigError, match="front.lora_adapters"):
        load_config(None, {"front.lora_adapters": {"adapter": "/adapters/a"}})


def test_truncating_to_the_context_leaves_one_id_for_the_output_when_the_request_asks_for_output(qwen3: Any) -> None:
    prompt = list(range(1000, 1010))
    with running_front(qwen3, **{"front.max_model_len": 6}) as front:
        url = f"{front.url}/v1/completions"
        assert httpx.post(url, json={"prompt": prompt, "max_tokens": 1, "truncate_prompt_tokens": -1}).is_success
        kept = next_submit(front).prompt_ids
        right = {"prompt": prompt, "max_tokens": 1, "truncate_prompt_tokens": 3, "truncation_side": "right"}
        assert httpx.post(url, json=right).is_success
        first = next_submit(front).prompt_ids
        too_many = httpx.post(url, json={"prompt": prompt, "max_tokens": 1, "truncate_prompt_tokens": 7})
        zero = httpx.post(url, json={"prompt": prompt, "max_tokens": 1, "truncate_prompt_tokens": 0})
    assert kept == prompt[-5:]  # max_model_len 6, one id kept free for the output
    assert first == prompt[:3]
    assert (too_many.status_code, too_many.json()["error"]["param"]) == (400, "truncate_prompt_tokens")
    assert (zero.status_code, zero.json()["error"]["param"]) == (400, "truncate_prompt_tokens")


def test_sampling_fields_may_name_the_models_ids_past_the_tokenizers(qwen3: Any) -> None:
    """Qwen3's model has 151,936 ids, its tokenizer 151,669: vLLM samples and takes all of the model's."""
    options = {"engine.source": "vllm", "engine.model": "m"}
    body = {"prompt": "Hi", "max_tokens": 1, "allowed_token_ids": [151_700], "logit_bias": {"151800": 5}}
    with running_front(qwen3, **options) as front:
        before = httpx.post(f"{front.url}/v1/completions", json=body, timeout=30)
        front.engine.vocab_size = 151_936
        deadline = time.monotonic() + 10
        while front.server.front.dispatcher.engine_vocab_size != 151_936 and time.monotonic() < deadline:
            time.sleep(0.01)  # the next EngineStats carry it
        after = httpx.post(f"{front.url}/v1/completions", json=body, timeout=30)
        beyond = httpx.post(f"{front.url}/v1/completions", json={**body, "allowed_token_ids": [151_936]}, timeout=30)
        sampling = next_submit(front).params.sampling
    assert before.status_code == 400
    assert after.status_code == 200 and sampling.allowed_token_ids == [151_700] and sampling.logit_bias == {151_800: 5}
    assert (beyond.status_code, beyond.json()["error"]["param"]) == (400, "allowed_token_ids")


WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


def test_tools_are_left_out_of_the_prompt_when_tool_choice_is_none_if_asked(qwen3: Any) -> None:
    prompts = []
    body = {**CHAT, "max_tokens": 1, "tools": [WEATHER_TOOL], "tool_choice": "none"}
    for exclude in (False, True):
        with running_front(qwen3, **{"front.exclude_tools_when_tool_choice_none": exclude}) as front:
            assert httpx.post(f"{front.url}/v1/chat/completions", json=body, timeout=30).is_success
            auto = {**body, "tool_choice": "auto"}
            assert httpx.post(f"{front.url}/v1/chat/completions", json=auto, timeout=30).is_success
            prompts.append([qwen3.decode(next_submit(front).prompt_ids) for _ in range(2)])
    (kept_none, kept_auto), (left_none, left_auto) = prompts
    assert "get_weather" in kept_none and "get_weather" in kept_auto and "get_weather" in left_auto
    assert "get_weather" not in left_none


def test_with_the_tool_parsers_grammar_the_engine_gets_the_tools_and_the_family_parser_reads_forced_calls(
    qwen3: Any,
) -> None:
    """front.tool_choice_grammar = tool_parser (vLLM's parsers with a structural tag): a forcing tool_choice, and
    auto when nothing else constrains the output, send the engine the fields it builds the grammar from; the calls
    are read by the family's parser (hermes), not by the JSON stages."""
    options = {
        "engine.source": "vllm",
        "engine.model": "m",
        "front.tool_call_parser": "hermes",
        "front.tool_choice_grammar": "tool_parser",
    }
    named = {"type": "function", "function": {"name": "get_weather"}}
    bodies = [
        {"tool_choice": "required", "parallel_tool_calls": False},
        {"tool_choice": named},
        {},
        {"tool_choice": "auto", "response_format": {"type": "json_object"}},
        {"tool_choice": "none"},
    ]
    with running_front(qwen3, **options) as front:
        for extra in bodies:
            body = {**CHAT, "max_tokens": 1, "tools": [WEATHER_TOOL], **extra}
            assert httpx.post(f"{front.url}/v1/chat/completions", json=body, timeout=30).is_success
        submits = [next_submit(front).params for _ in bodies]
        unnamed = {**CHAT, "tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "function": {"name": "x"}}}
        refused = httpx.post(f"{front.url}/v1/chat/completions", json=unnamed, timeout=30)
    required, forced, auto, formatted, none = submits
    for params, choice, parallel in ((required, "required", False), (forced, named, None), (auto, None, None)):
        assert params.sampling.constraint is not None and params.sampling.constraint.kind == "tool_calls"
        spec = {"tools": [WEATHER_TOOL], "tool_choice": choice, "parallel_tool_calls": parallel}
        assert json.loads(params.sampling.constraint.spec) == spec
        assert (params.detok.tool_call_parser, params.detok.tool_function) == ("hermes", "")
    assert formatted.sampling.constraint is not None and formatted.sampling.constraint.kind == "json_object"
    assert none.sampling.constraint is None and none.detok.tool_call_parser == ""
    assert (refused.status_code, refused.json()["error"]["param"]) == (400, "tool_choice")


def test_the_tool_parsers_grammar_needs_the_vllm_source() -> None:
    with pytest.raises(ConfigError, match="front.tool_choice_grammar"):
        load_config(None, {"front.tool_choice_grammar": "tool_parser"})


def test_the_access_log_leaves_out_the_paths_asked(qwen3: Any, caplog: pytest.LogCaptureFixture) -> None:
    options = {"front.access_log_skip_paths": ["/health"]}
    with caplog.at_level(logging.INFO, logger="detok.access"), running_front(qwen3, **options) as front:
        httpx.get(f"{front.url}/health")
        httpx.get(f"{front.url}/v1/models")
    paths = [
        record.getMessage().split(" path=")[1].split()[0] for record in caplog.records if record.name == "detok.access"
    ]
    assert "/v1/models" in paths and "/health" not in paths


def test_load_counts_the_generation_requests_in_flight_when_asked(qwen3: Any) -> None:
    """A request the engine gives nothing holds until its deadline (front.request_timeout_s): in flight meanwhile."""
    for tracking in (True, False):
        options = {"front.server_load": tracking, "front.request_timeout_s": 2.0}
        with running_front(qwen3, **options) as front:
            front.set_plan(lambda submit: [])
            url = f"{front.url}/load"
            idle = httpx.get(url).json()["server_load"]
            with ThreadPoolExecutor(1) as pool:
                waiting = pool.submit(httpx.post, f"{front.url}/v1/completions", json={"prompt": "Hi"}, timeout=30)
                deadline = time.monotonic() + 1.5
                busy = 0
                while not busy and time.monotonic() < deadline:
                    busy = httpx.get(url).json()["server_load"]
                status = waiting.result().status_code
            after = httpx.get(url).json()["server_load"]
        assert (idle, busy, status, after) == (0, 1 if tracking else 0, 504, 0)


def sse_chunks(response: httpx.Response) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]


def test_the_engines_fingerprint_is_on_whole_answers_and_each_streams_last_chunk(qwen3: Any) -> None:
    """Where vLLM's server writes its system_fingerprint: whole bodies; streamed, the usage chunk with
    include_usage, else each choice's chunk with its finish_reason; never on other chunks."""
    with running_front(qwen3) as front:
        assert (
            httpx.post(f"{front.url}/v1/chat/completions", json=CHAT, timeout=30).json().get("system_fingerprint")
            is None
        )
        front.engine.system_fingerprint = "vllm-0.32.0-abcd1234"
        deadline = time.monotonic() + 10
        while front.server.front.dispatcher.system_fingerprint != "vllm-0.32.0-abcd1234":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        whole_chat = httpx.post(f"{front.url}/v1/chat/completions", json=CHAT, timeout=30).json()
        whole_text = httpx.post(f"{front.url}/v1/completions", json={"prompt": "Hi", "max_tokens": 3}, timeout=30)
        streams = {}
        for name, path, body in (
            ("chat", "/v1/chat/completions", {**CHAT, "n": 2}),
            ("completion", "/v1/completions", {"prompt": "Hi there", "max_tokens": 3}),
            ("chat usage", "/v1/chat/completions", {**CHAT, "stream_options": {"include_usage": True}}),
        ):
            with httpx.stream("POST", f"{front.url}{path}", json={**body, "stream": True}, timeout=30) as response:
                streams[name] = sse_chunks(response)
    assert whole_chat["system_fingerprint"] == whole_text.json()["system_fingerprint"] == "vllm-0.32.0-abcd1234"

    def fingerprinted(chunks: list[dict[str, Any]]) -> list[tuple[bool, list[str | None]]]:
        return [
            (bool(chunk.get("usage")), [choice["finish_reason"] for choice in chunk["choices"]])
            for chunk in chunks
            if chunk.get("system_fingerprint") == "vllm-0.32.0-abcd1234"
        ]

    chat_marks = fingerprinted(streams["chat"])  # one per choice, on its last chunk
    assert len(chat_marks) == 2 and all(not usage and finishes[0] is not None for usage, finishes in chat_marks)
    last_finish = streams["completion"][-1]["choices"][0]["finish_reason"]
    assert last_finish is not None and fingerprinted(streams["completion"]) == [(False, [last_finish])]
    assert fingerprinted(streams["chat usage"]) == [(True, [])]


def test_the_answers_role_is_the_response_role_unless_no_answer_is_asked_for(qwen3: Any) -> None:
    with running_front(qwen3, **{"front.response_role": "bot"}) as front:
        whole = httpx.post(f"{front.url}/v1/chat/completions", json=CHAT, timeout=30).json()
        with httpx.stream("POST", f"{front.url}/v1/chat/completions", json={**CHAT, "stream": True}, timeout=30) as r:
            first = sse_chunks(r)[0]
        continued = {
            "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hel"}],
            "add_generation_prompt": False,
            "continue_final_message": True,
        }
        last_role = httpx.post(f"{front.url}/v1/chat/completions", json=continued, timeout=30).json()
    assert whole["choices"][0]["message"]["role"] == "bot"
    assert first["choices"][0]["delta"]["role"] == "bot"
    assert last_role["choices"][0]["message"]["role"] == "assistant"  # the last message's, as vLLM's server


def test_under_a_root_path_every_route_answers_with_and_without_the_prefix(qwen3: Any) -> None:
    """--root-path /llm (front.root_path): a path-routing proxy forwards /llm/v1/... as is or stripped; both reach
    the routes, streamed (the direct SSE route) and not, and the metrics name the route without the prefix."""
    with running_front(qwen3, **{"front.root_path": "/llm"}) as front:
        body = {"prompt": "Hi there", "max_tokens": 3}
        answers = [httpx.post(f"{front.url}{prefix}/v1/completions", json=body, timeout=30) for prefix in ("/llm", "")]
        with httpx.stream("POST", f"{front.url}/llm/v1/completions", json={**body, "stream": True}, timeout=30) as r:
            streamed = "".join(chunk["choices"][0]["text"] for chunk in sse_chunks(r) if chunk["choices"])
        health = httpx.get(f"{front.url}/llm/health", timeout=10).status_code
        metrics = httpx.get(f"{front.url}/llm/metrics", timeout=10).text
        unknown = httpx.get(f"{front.url}/llmx/v1/models", timeout=10).status_code
    assert [answer.status_code for answer in answers] == [200, 200]
    assert answers[0].json()["choices"][0]["text"] == answers[1].json()["choices"][0]["text"] == streamed != ""
    assert health == 200 and unknown == 404
    assert 'endpoint="/v1/completions"' in metrics and "/llm/v1" not in metrics


def test_sse_keep_alive_comments_while_a_stream_waits_for_its_engine(qwen3: Any) -> None:
    """--sse-keep-alive-interval (front.sse_keep_alive_s): a stream whose engine sends nothing gets its head after
    the interval and a `: keep-alive` comment every interval until its text comes, which is then whole."""
    with running_front(qwen3, **{"front.sse_keep_alive_s": 0.2}) as front:
        front.set_plan(lambda submit: [])  # the engine stays silent until the test sends the text
        body = {"prompt": "Hi there", "max_tokens": 3, "stream": True}
        with httpx.stream("POST", f"{front.url}/v1/completions", json=body, timeout=30) as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            comments = 0
            while comments < 3:
                line = next(lines)
                assert line in (": keep-alive", ""), line
                comments += line == ": keep-alive"
            submit = next_submit(front)
            ids = qwen3.encode(" and more").ids
            front.engine.send_raw(
                encode(text_batch(PLAYED_WORKER, time.time_ns(), 0, decode_plan(qwen3, submit.rid, ids)))
            )
            rest = list(lines)
    payloads = [json.loads(line[6:]) for line in rest if line.startswith("data: {")]
    assert "".join(chunk["choices"][0]["text"] for chunk in payloads) == " and more"
    assert payloads[-1]["choices"][0]["finish_reason"] == "length"
    assert [line for line in rest if line][-1] == "data: [DONE]"


def test_chat_echo_puts_the_last_message_before_the_answer(qwen3: Any) -> None:
    """vLLM's chat echo: when the last message has the answer's role (continuing an assistant message), its
    content comes first: streamed, in a chunk after the role's; whole, before the message's content."""
    continued = {
        "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hel"}],
        "add_generation_prompt": False,
        "continue_final_message": True,
    }
    with running_front(qwen3) as front:
        plain = httpx.post(f"{front.url}/v1/chat/completions", json=continued, timeout=30).json()
        echoed = httpx.post(f"{front.url}/v1/chat/completions", json={**continued, "echo": True}, timeout=30).json()
        body = {**continued, "echo": True, "stream": True}
        with httpx.stream("POST", f"{front.url}/v1/chat/completions", json=body, timeout=30) as response:
            chunks = sse_chunks(response)
        to_user = httpx.post(f"{front.url}/v1/chat/completions", json={**CHAT, "echo": True}, timeout=30).json()
        plain_user = httpx.post(f"{front.url}/v1/chat/completions", json=CHAT, timeout=30).json()
    answer = plain["choices"][0]["message"]["content"]
    assert answer and echoed["choices"][0]["message"]["content"] == "Hel" + answer
    deltas = [chunk["choices"][0]["delta"] for chunk in chunks if chunk["choices"]]
    assert deltas[0] == {"role": "assistant", "content": ""} and deltas[1] == {"content": "Hel"}
    assert "".join(delta.get("content") or "" for delta in deltas) == "Hel" + answer
    # the last message is the user's: nothing to echo
    assert to_user["choices"][0]["message"]["content"] == plain_user["choices"][0]["message"]["content"]


def test_prompt_tokens_details_report_the_engines_cached_prompt_tokens(qwen3: Any) -> None:
    """--enable-prompt-tokens-details (front.prompt_tokens_details): choice 0's engine request asks for the cached
    prompt tokens; the usage has them (chat also the ones the prefill wrote to the cache), whole and streamed."""
    options = {"engine.source": "vllm", "engine.model": "m", "front.prompt_tokens_details": True}
    with running_front(qwen3, **options) as front:
        text = httpx.post(f"{front.url}/v1/completions", json={"prompt": "Hi there", "n": 2}, timeout=30).json()
        chat = httpx.post(f"{front.url}/v1/chat/completions", json=CHAT, timeout=30).json()
        body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
        with httpx.stream("POST", f"{front.url}/v1/chat/completions", json=body, timeout=30) as response:
            streamed = sse_chunks(response)[-1]["usage"]
        asked = [next_submit(front).params.report_cached for _ in range(4)]
    assert text["usage"]["prompt_tokens_details"] == {"cached_tokens": 5}
    assert chat["usage"]["prompt_tokens_details"] == streamed["prompt_tokens_details"]
    assert streamed["prompt_tokens_details"] == {"cached_tokens": 5, "created_cache_tokens": 2}
    assert asked == [True, False, True, True]  # n = 2: choice 0 only
    with running_front(qwen3) as front:
        assert "prompt_tokens_details" not in httpx.post(f"{front.url}/v1/chat/completions", json=CHAT).json()["usage"]


WEATHER_TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize(
    ("tool_choice", "message"),
    [
        (None, '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'),
        ("auto", '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'),
        ("required", 'tool_choice="required" requires --tool-call-parser to be set'),
        (
            {"type": "function", "function": {"name": "weather"}},
            'tool_choice=function "weather" requires --tool-call-parser to be set',
        ),
    ],
)
def test_tools_no_parser_reads_are_refused_as_vllms_server_refuses_them(
    qwen3: Any, tool_choice: Any, message: str
) -> None:
    """front.tools_need_parser (vLLM's server without --enable-auto-tool-choice): a request with tools is a 400
    naming tool_choice, and nothing reaches the engine; tool_choice "none" and requests without tools run."""
    options = {"front.tools_need_parser": True, "front.tool_call_parser": "none"}
    with running_front(qwen3, **options) as front:
        body = {**CHAT, "max_tokens": 2, "tools": WEATHER_TOOLS}
        refused = httpx.post(
            f"{front.url}/v1/chat/completions",
            json={**body, **({} if tool_choice is None else {"tool_choice": tool_choice})},
        )
        none = httpx.post(f"{front.url}/v1/chat/completions", json={**body, "tool_choice": "none"}, timeout=30)
        plain = httpx.post(f"{front.url}/v1/chat/completions", json={**CHAT, "max_tokens": 2}, timeout=30)
        submitted = [next_submit(front) for _ in range(2)]
        time.sleep(0.2)
        left = front.engine.submits.qsize()
    assert refused.status_code == 400
    assert (refused.json()["error"]["param"], refused.json()["error"]["message"]) == ("tool_choice", message)
    assert none.status_code == plain.status_code == 200 and len(submitted) == 2 and left == 0


def test_tools_run_where_a_parser_reads_them(qwen3: Any) -> None:
    options = {"front.tools_need_parser": True, "front.tool_call_parser": "hermes"}
    with running_front(qwen3, **options) as front:
        body = {**CHAT, "max_tokens": 2, "tools": WEATHER_TOOLS}
        answer = httpx.post(f"{front.url}/v1/chat/completions", json=body, timeout=30)
    assert answer.status_code == 200, answer.text


def test_thinking_off_runs_no_qwen3_reasoning_parser(qwen3: Any) -> None:
    """vLLM's qwen3 parser reads the chat's enable_thinking (the request's over --default-chat-template-kwargs): off,
    the whole output is content, whatever the prompt; on, it reasons from the start."""
    options = {"front.reasoning_parser": "qwen3_vllm", "front.chat_template_kwargs": {"enable_thinking": False}}
    with running_front(qwen3, **options) as front:
        for kwargs in ({}, {"enable_thinking": True}, {"enable_thinking": 0}):
            body = {**CHAT, "max_tokens": 2, "chat_template_kwargs": kwargs}
            assert httpx.post(f"{front.url}/v1/chat/completions", json=body, timeout=30).status_code == 200
        parsers = [next_submit(front).params.detok.reasoning_parser for _ in range(3)]
    assert parsers == ["", "qwen3_vllm", ""]


def test_logprob_token_ids_go_to_the_engine_with_vllms_checks(qwen3: Any) -> None:
    """vLLM's completions field: the given ids reach the engine; without logprobs, outside the vocabulary, on a chat
    or on another engine source it is a 400 naming it, and nothing is submitted."""
    body = {"prompt": "Hi", "max_tokens": 2, "logprob_token_ids": [9707, 0]}
    with running_front(qwen3, **{"engine.source": "vllm", "engine.model": "m"}) as front:
        url = front.url
        taken = httpx.post(f"{url}/v1/completions", json={**body, "logprobs": 1}, timeout=30)
        ids = next_submit(front).params.sampling.logprob_token_ids
        refused = [
            httpx.post(f"{url}/v1/completions", json=body),
            httpx.post(f"{url}/v1/completions", json={**body, "logprobs": 1, "logprob_token_ids": [10**7]}),
            httpx.post(f"{url}/v1/chat/completions", json={**CHAT, "logprobs": True, "logprob_token_ids": [1]}),
        ]
        time.sleep(0.2)
        left = front.engine.submits.qsize()
    with running_front(qwen3) as front:
        elsewhere = httpx.post(f"{front.url}/v1/completions", json={**body, "logprobs": 1})
    assert taken.status_code == 200 and ids == [9707, 0] and left == 0
    assert [(r.status_code, r.json()["error"]["param"]) for r in [*refused, elsewhere]] == [
        (400, "logprob_token_ids")
    ] * 4


def output_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "detok.requests" and "Generated" in r.getMessage()]


def test_chat_outputs_are_logged_as_vllms_server_logs_them(qwen3: Any, caplog: pytest.LogCaptureFixture) -> None:
    """--enable-log-outputs (with --enable-log-requests): a whole chat's choices, a stream's pieces and its end;
    completions are not logged (vLLM logs chat outputs only); the text is cut to max_log_len."""
    options = {"front.log_requests": True, "front.log_outputs": True, "front.max_log_len": 40}
    with caplog.at_level(logging.INFO, logger="detok.requests"), running_front(qwen3, **options) as front:
        whole = httpx.post(f"{front.url}/v1/chat/completions", json={**CHAT, "max_tokens": 50}, timeout=30).json()
        after_whole = output_lines(caplog)
        with httpx.stream("POST", f"{front.url}/v1/chat/completions", json={**CHAT, "stream": True}) as response:
            streamed = "".join(
                json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
                for line in response.iter_lines()
                if line.startswith("data: {")
            )
        after_stream = output_lines(caplog)
        httpx.post(f"{front.url}/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=30)
        after_completion = output_lines(caplog)
    content, finish = whole["choices"][0]["message"]["content"], whole["choices"][0]["finish_reason"]
    assert after_whole == [f"Generated response {whole['id']}: output: {content[:40]!r}, finish_reason: {finish}"]
    stream_lines = after_stream[1:]
    deltas = [line for line in stream_lines if "(streaming delta)" in line]
    assert len(deltas) > 1 and all(line.startswith("Generated response chatcmpl-") for line in deltas)
    assert stream_lines[-1].endswith(
        f"(streaming complete): output: {streamed[:40]!r}, finish_reason: streaming_complete"
    )
    assert after_completion == after_stream


def test_without_log_deltas_a_stream_logs_its_end_only(qwen3: Any, caplog: pytest.LogCaptureFixture) -> None:
    options = {"front.log_requests": True, "front.log_outputs": True, "front.log_deltas": False}
    with caplog.at_level(logging.INFO, logger="detok.requests"), running_front(qwen3, **options) as front:
        body = {**CHAT, "stream": True}
        response = httpx.post(f"{front.url}/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 200 and response.text.endswith("data: [DONE]\n\n")
    lines = output_lines(caplog)
    assert len(lines) == 1 and "(streaming complete)" in lines[0]
