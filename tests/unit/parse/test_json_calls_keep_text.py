"""llama3_json and mistral keep text that is not a call: an output whose first object never names a function is
content, with its `<|python_tag|>` / `[TOOL_CALLS]` marker (as vLLM keeps an output whose calls do not parse); a
named call without arguments has `{}` (hermes too). Whole and however the text is cut."""

from __future__ import annotations

import pytest
from helpers.parse_cases import parse_in_pieces


@pytest.mark.parametrize(
    ("parser_name", "text", "content", "calls"),
    [
        ("llama3_json", '{"foo": 1} hi', '{"foo": 1} hi', []),
        ("llama3_json", " <|python_tag|>print(1)", " <|python_tag|>print(1)", []),
        ("llama3_json", '<|python_tag|>{"x": ', '<|python_tag|>{"x": ', []),
        ("llama3_json", '<|python_tag|>{"name": "f"}; {"x": 2} t', '{"x": 2}t', [("f", "{}")]),
        ("mistral", 'a [TOOL_CALLS] [{"x": 1}] b', 'a [TOOL_CALLS] [{"x": 1}] b', []),
        ("mistral", "a [TOOL_CALLS] hi", "a [TOOL_CALLS] hi", []),
        ("mistral", "[TOOL_CALLS][]", "[TOOL_CALLS][]", []),
        (
            "mistral",
            '[TOOL_CALLS][{"name": "f"}, {"x": 1}, {"name": "g", "arguments": {"a": 1}}]',
            '{"x": 1}',
            [("f", "{}"), ("g", '{"a": 1}')],
        ),
        ("hermes", '<tool_call>{"name": "f"}</tool_call>', "", [("f", "{}")]),
    ],
)
def test_text_that_is_no_call_stays_content(
    parser_name: str, text: str, content: str, calls: list[tuple[str, str]]
) -> None:
    whole = parse_in_pieces(parser_name, text, [])
    assert (whole.content, [(call.name, call.arguments) for call in whole.tool_calls]) == (content, calls)
    assert parse_in_pieces(parser_name, text, list(range(1, len(text)))) == whole  # character by character
    for cut in range(1, len(text)):
        assert parse_in_pieces(parser_name, text, [cut]) == whole
