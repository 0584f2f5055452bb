"""A hermes `<tool_call>` that never names a function (not JSON, an object without a name, or the output ends
first) was not a call: its marker and text stay in content, whole and however the text is cut."""

from __future__ import annotations

import pytest
from helpers.parse_cases import calls_of, parse_every_way


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        ("a<tool_call>not json</tool_call> b", "a<tool_call>not json</tool_call> b", []),
        ('<tool_call>{"arguments": {"x": 1}}</tool_call>', '<tool_call>{"arguments": {"x": 1}}</tool_call>', []),
        ('x<tool_call>\n{"argu', 'x<tool_call>\n{"argu', []),
        (
            '<tool_call>oops</tool_call><tool_call>{"arguments": {"q": 2}, "name": "f"}</tool_call>',
            "<tool_call>oops</tool_call>",
            [("f", '{"q": 2}')],
        ),
    ],
)
def test_a_call_without_a_name_stays_content(text: str, content: str, calls: list[tuple[str, str]]) -> None:
    whole = parse_every_way("hermes", text)
    assert (whole.content, calls_of(whole)) == (content, calls)
