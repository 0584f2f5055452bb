"""The table of request fields (bus/request_fields.py) against the structs it describes: every row names a bus
field and a request field, and every bus sampling field is a row or set by the front itself."""

from __future__ import annotations

from detok_worker.bus.messages import RequestParams, SamplingParams
from detok_worker.bus.request_fields import FIELDS
from detok_worker.front.openai_api import ChatCompletionRequest, CompletionRequest

NOT_IN_THE_TABLE = {"n", "constraint"}  # the front fans n out; the constraint has sources of its own


def test_every_row_names_a_bus_field_and_a_request_field() -> None:
    request_fields = set(CompletionRequest.__struct_fields__) | set(ChatCompletionRequest.__struct_fields__)
    for field in FIELDS:
        struct = RequestParams if field.on_request else SamplingParams
        assert field.name in struct.__struct_fields__, field
        assert field.client_name in request_fields, field


def test_every_bus_sampling_field_is_in_the_table() -> None:
    rows = {field.name for field in FIELDS if not field.on_request}
    assert set(SamplingParams.__struct_fields__) == rows | NOT_IN_THE_TABLE


def test_the_defaults_ask_the_engine_nothing() -> None:
    for field in FIELDS:
        assert not field.asks(field.value_of(RequestParams(max_tokens=1))), field
