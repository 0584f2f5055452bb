"""The stages of a chat tool_choice that forces calls: "required" (a JSON array of {"name", "parameters"}) and a
named function (the whole output is its arguments). Whole and however the text is cut, the same calls; text that is
no such array is content."""

from __future__ import annotations

import pytest
from helpers.parse_cases import calls_of, parse_every_way

from detok_worker.parse.base import ParsedOutput
from detok_worker.parse.registry import NAMED_CALL, REQUIRED_CALLS, create_parser


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        ('[{"name": "f", "parameters": {"a": [1, "]"]}}]', "", [("f", '{"a": [1, "]"]}')]),
        (
            ' [ {"name": "f", "parameters": {}} ,\n{"parameters": {"b": "\\"}"}, "name": "g"} ]',
            "",
            [("f", "{}"), ("g", '{"b": "\\"}"}')],
        ),
        ('[{"name": "f", "parameters": {"a": 1}}', "", [("f", '{"a": 1}')]),  # cut off before "]": the call stands
        ('[{"name": "f", "parameters": {"a": 1}}] tail', " tail", [("f", '{"a": 1}')]),
        ('{"name": "f", "parameters": {}}', '{"name": "f", "parameters": {}}', []),  # no array: content
        ("[]", "[]", []),
        ('[{"x": 1}]', '[{"x": 1}]', []),
    ],
)
def test_required_calls(text: str, content: str, calls: list[tuple[str, str]]) -> None:
    out = parse_every_way(REQUIRED_CALLS, text)
    assert (out.content, calls_of(out)) == (content, calls)


def test_a_named_function_gets_the_whole_output_as_its_arguments() -> None:
    text = '{"city": "Paris \\u00e9", "n": [1, 2]}'
    wholes = []
    for cut in range(len(text) + 1):
        parser = create_parser("", NAMED_CALL, "", "get_weather")
        assert parser is not None
        out = ParsedOutput()
        for piece in (text[:cut], text[cut:]):
            if piece:
                out.extend(parser.feed(piece))
        out.extend(parser.finish())
        wholes.append(out)
    assert all(out == wholes[0] for out in wholes)
    assert (wholes[0].content, calls_of(wholes[0])) == ("", [("get_weather", text)])


def test_reasoning_then_a_named_call() -> None:
    parser = create_parser("qwen3", NAMED_CALL, "", "f")
    assert parser is not None
    out = parser.feed('<think>\nhm\n</think>\n\n{"a": 1}')
    out.extend(parser.finish())
    assert (out.reasoning, calls_of(out)) == ("\nhm\n", [("f", '\n\n{"a": 1}')])
