"""The JSON call parsers keep text that is not a call: an output whose first object never names a function is
content, with its `<|python_tag|>` / `[TOOL_CALLS]` marker (as vLLM keeps an output whose calls do not parse); text
around or after a named call that is not markup is content; a named call without arguments has `{}`. Whole and
however the text is cut."""

from __future__ import annotations

import pytest
from helpers.parse_cases import calls_of, parse_every_way


@pytest.mark.parametrize(
    ("parser_name", "text", "content", "calls"),
    [
        ("llama3_json", '{"foo": 1} hi', '{"foo": 1} hi', []),
        ("llama3_json", " <|python_tag|>print(1)", " <|python_tag|>print(1)", []),
        ("llama3_json", '<|python_tag|>{"x": ', '<|python_tag|>{"x": ', []),
        ("llama3_json", '<|python_tag|>{"name": "f"}; {"x": 2} t', '; {"x": 2} t', [("f", "{}")]),
        # between calls: whitespace and one `;`; any other text ends the calls, and from the last call on is content
        ("llama3_json", '{"name": "f"}; ; {"name": "g"} t', '; ; {"name": "g"} t', [("f", "{}")]),
        ("llama3_json", '{"name": "f"}\n{"name": "g"}', "", [("f", "{}"), ("g", "{}")]),
        ("llama3_json", '{"name": "f"} tail', " tail", [("f", "{}")]),
        ("llama3_json", '{"name": "f"}; ', "", [("f", "{}")]),  # the markup after the last call
        # a named call that breaks ends the calls: the breaking character and what follows are content
        (
            "llama3_json",
            '{"name": "f", "parameters": {"a": 1} x}; {"name": "g"}',
            'x}; {"name": "g"}',
            [("f", '{"a": 1}')],
        ),
        ("mistral", 'a [TOOL_CALLS] [{"x": 1}] b', 'a [TOOL_CALLS] [{"x": 1}] b', []),
        ("mistral", "a [TOOL_CALLS] hi", "a [TOOL_CALLS] hi", []),
        ("mistral", "[TOOL_CALLS][]", "[TOOL_CALLS][]", []),
        (
            "mistral",
            '[TOOL_CALLS][{"name": "f"}, {"x": 1}, {"name": "g", "arguments": {"a": 1}}]',
            ', {"x": 1}',
            [("f", "{}"), ("g", '{"a": 1}')],
        ),
        ("mistral", '[TOOL_CALLS][{"name": "f"} ; {"name": "g"}] t', ' ; {"name": "g"}] t', [("f", "{}")]),
        ("mistral", '[TOOL_CALLS][{"name": "f"},, {"name": "g"}]', ',, {"name": "g"}]', [("f", "{}")]),
        ("mistral", '[TOOL_CALLS][{"name": "f"}]] t', "] t", [("f", "{}")]),
        ("mistral", '[TOOL_CALLS] [{"name": "f"}] [TOOL_CALLS] hi', " [TOOL_CALLS] hi", [("f", "{}")]),
        ("mistral", '[TOOL_CALLS] {"name": "f"} t', " t", [("f", "{}")]),
        ("mistral", '[TOOL_CALLS][{"name": "f"}, ', "", [("f", "{}")]),
        (
            "mistral",
            '[TOOL_CALLS][{"name": "f", "arguments": {} x}, {"name": "g"}]',
            'x}, {"name": "g"}]',
            [("f", "{}")],
        ),
        ("hermes", '<tool_call>{"name": "f"}</tool_call>', "", [("f", "{}")]),
        # text inside the block after the call object (from its first non-space character) is content
        ("hermes", '<tool_call>{"name": "f", "arguments": {}} junk</tool_call> after', "junk after", [("f", "{}")]),
        # the character that breaks a named call, and what follows it in the block, are content
        ("hermes", '<tool_call>{"name": "f", "arguments": {"a": 1} x}</tool_call>', "x}", [("f", '{"a": 1}')]),
        ("hermes", '<tool_call>{"name": "f" x</tool_call>', "x", [("f", "{}")]),
        # a block whose closing marker is missing ends at the next opening one
        ("hermes", '<tool_call>{"name": "f"}\n<tool_call>{"name": "g"}</tool_call>', "", [("f", "{}"), ("g", "{}")]),
        # a key that is not a valid JSON string breaks the object
        ("hermes", '<tool_call>{"\\x": 1}</tool_call>', '<tool_call>{"\\x": 1}</tool_call>', []),
    ],
)
def test_text_that_is_no_call_stays_content(
    parser_name: str, text: str, content: str, calls: list[tuple[str, str]]
) -> None:
    whole = parse_every_way(parser_name, text)
    assert (whole.content, calls_of(whole)) == (content, calls)
