"""/v1/load_lora_adapter and /v1/unload_lora_adapter in a real front (front.runtime_lora_updating) with a played
engine: the front checks the body, asks the engine (an AdapterCall), answers with the engine's status and message
as vLLM's server does, and serves the engine's adapter table as models, whichever front's call changed it. The
engine's side (vLLM's engine core loading the adapter) runs in tests/e2e/test_vllm_flags.py."""

from __future__ import annotations

import queue
from typing import Any

import httpx
import pytest
from helpers.front_harness import running_front
from helpers.serve_helpers import wait_for

from detok_worker.bus.messages import AdapterAnswer, AdapterCall
from detok_worker.config import ConfigError, load_config

OPTIONS = {
    "engine.source": "vllm",
    "engine.model": "m",
    "front.model_name": "base",
    "front.runtime_lora_updating": True,
    "front.lora_adapters": {"static": "/adapters/s"},
}


class PlayedTable:
    """The engine's adapter table as the played engine keeps it: a load adds, an unload removes, a path under
    /missing is not found."""

    def __init__(self) -> None:
        self.table = {"static": "/adapters/s"}

    def answer(self, call: AdapterCall) -> AdapterAnswer:
        if call.path.startswith("/missing"):
            return AdapterAnswer(call.call, 404, f"no adapter at {call.path}", dict(self.table))
        if call.path:
            self.table[call.name] = call.path
            return AdapterAnswer(call.call, 200, f"Success: {call.name} added", dict(self.table))
        if self.table.pop(call.name, None) is None:
            return AdapterAnswer(call.call, 404, f"{call.name} cannot be found", dict(self.table))
        return AdapterAnswer(call.call, 200, f"Success: {call.name} removed", dict(self.table))


def model_ids(url: str, **headers: str) -> list[str]:
    return [card["id"] for card in httpx.get(f"{url}/v1/models", headers=headers).json()["data"]]


def test_adapters_load_and_unload_through_the_engine_and_are_served_as_models(qwen3: Any) -> None:
    played = PlayedTable()
    with running_front(qwen3, **OPTIONS) as front:
        front.engine.adapter_answer = played.answer
        url = front.url
        loaded = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "new", "lora_path": "/adapters/n"})
        call = front.engine.adapter_calls.get(timeout=5)
        models_after_load = model_ids(url)
        card = httpx.get(f"{url}/v1/models/new").json()
        on_new = httpx.post(f"{url}/v1/completions", json={"model": "new", "prompt": "Hi", "max_tokens": 2})
        lora = front.engine.submits.get(timeout=10).params.lora
        missing = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "gone", "lora_path": "/missing/g"})
        unloaded = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "new"})
        models_after_unload = model_ids(url)
        on_unloaded = httpx.post(f"{url}/v1/completions", json={"model": "new", "prompt": "Hi", "max_tokens": 2})
        unknown = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "new"})
    assert (loaded.status_code, loaded.text) == (200, "Success: new added")
    assert (call.name, call.path, call.load_inplace, call.is_3d, call.front) == ("new", "/adapters/n", False, False, 0)
    assert models_after_load == ["base", "static", "new"]
    assert (card["root"], card["parent"]) == ("/adapters/n", "base")
    assert on_new.status_code == 200 and on_new.json()["model"] == "new" and lora == "new"
    assert missing.status_code == 404
    assert missing.json()["error"]["message"] == "no adapter at /missing/g"
    assert (unloaded.status_code, unloaded.text) == (200, "Success: new removed")
    assert models_after_unload == ["base", "static"]
    assert on_unloaded.status_code == 404
    assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "not_found_error"


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/load_lora_adapter", {"lora_name": "x"}, "lora_path"),
        ("/v1/load_lora_adapter", {"lora_name": "", "lora_path": "/adapters/x"}, None),
        (
            "/v1/load_lora_adapter",
            {"lora_name": "x", "lora_path": "/adapters/x", "load_inplace": "yes"},
            "load_inplace",
        ),
        ("/v1/unload_lora_adapter", {"lora_name": ""}, None),
        ("/v1/unload_lora_adapter", {}, "lora_name"),
    ],
)
def test_a_bad_body_is_a_400_that_never_reaches_the_engine(
    qwen3: Any, path: str, body: dict[str, Any], param: str | None
) -> None:
    with running_front(qwen3, **OPTIONS) as front:
        front.engine.adapter_answer = PlayedTable().answer
        response = httpx.post(f"{front.url}{path}", json=body)
        with pytest.raises(queue.Empty):
            front.engine.adapter_calls.get(timeout=0.3)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param


def test_the_routes_need_the_api_key(qwen3: Any) -> None:
    with running_front(qwen3, **OPTIONS, **{"front.api_key": "secret"}) as front:
        front.engine.adapter_answer = PlayedTable().answer
        body = {"lora_name": "new", "lora_path": "/adapters/n"}
        without = httpx.post(f"{front.url}/v1/load_lora_adapter", json=body)
        unload_without = httpx.post(f"{front.url}/v1/unload_lora_adapter", json={"lora_name": "static"})
        with_key = httpx.post(
            f"{front.url}/v1/load_lora_adapter", json=body, headers={"Authorization": "Bearer secret"}
        )
    assert (without.status_code, unload_without.status_code, with_key.status_code) == (401, 401, 200)


def test_the_engines_table_is_served_whichever_front_changed_it(qwen3: Any) -> None:
    """Another front's load reaches this one in the engine's stats: its adapters are this front's models too."""
    with running_front(qwen3, **OPTIONS) as front:
        front.engine.lora_adapters = {"static": "/adapters/s", "elsewhere": "/adapters/e"}
        wait_for(lambda: "elsewhere" in model_ids(front.url), 5, what="the engine's table served")
        on_it = httpx.post(f"{front.url}/v1/completions", json={"model": "elsewhere", "prompt": "Hi", "max_tokens": 2})
        front.engine.lora_adapters = {}
        wait_for(lambda: model_ids(front.url) == ["base"], 5, what="the adapters gone")
    assert on_it.status_code == 200 and on_it.json()["model"] == "elsewhere"


def test_without_runtime_updating_the_routes_do_not_exist(qwen3: Any) -> None:
    with running_front(qwen3, **{**OPTIONS, "front.runtime_lora_updating": False}) as front:
        response = httpx.post(f"{front.url}/v1/load_lora_adapter", json={"lora_name": "n", "lora_path": "/a"})
        with pytest.raises(queue.Empty):
            front.engine.adapter_calls.get(timeout=0.3)
    assert response.status_code == 404


def test_runtime_updating_needs_the_vllm_source() -> None:
    with pytest.raises(ConfigError, match="front.runtime_lora_updating"):
        load_config(None, {"front.runtime_lora_updating": True})
