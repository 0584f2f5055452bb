"""The mistral parser reads the newer Mistral format (mistral-common tokenizer v11+: Mistral Small 3.2, Magistral,
Devstral), `[TOOL_CALLS]name[ARGS]{...}` per call, optionally with `[CALL_ID]id` before `[ARGS]`, besides
`[TOOL_CALLS][{...}]`: the name is known at `[ARGS]`, the arguments stream as the model writes them; what does
not make such a call (no name, no `[ARGS]`, no arguments object) is content, marker included. Whole and however
the text is cut."""

from __future__ import annotations

import pytest
from helpers.parse_cases import calls_of, parse_every_way

LONG_NAME = "f" * 65


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        ('[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', "", [("get_weather", '{"city": "Paris"}')]),
        (
            'Sure.[TOOL_CALLS]a[ARGS]{"x": [1, {"y": "}"}]}[TOOL_CALLS]b.c-d_2[ARGS]{}',
            "Sure.",
            [("a", '{"x": [1, {"y": "}"}]}'), ("b.c-d_2", "{}")],
        ),
        ('[TOOL_CALLS]f[CALL_ID]a1B2c3D4e[ARGS]{"q": 1}', "", [("f", '{"q": 1}')]),
        ('[TOOL_CALLS]f[ARGS] {"q": 1} done', " done", [("f", '{"q": 1}')]),
        ('[TOOL_CALLS]f[ARGS]{"q": ', "", [("f", '{"q": ')]),  # cut off: keeps what was streamed
        ("[TOOL_CALLS]hello world", "[TOOL_CALLS]hello world", []),
        ("[TOOL_CALLS]f[ARGS]oops", "[TOOL_CALLS]f[ARGS]oops", []),
        ("[TOOL_CALLS]f[AR", "[TOOL_CALLS]f[AR", []),
        ("[TOOL_CALLS]f[CALL_ID][ARGS]{}", "[TOOL_CALLS]f[CALL_ID][ARGS]{}", []),
        (f"[TOOL_CALLS]{LONG_NAME}[ARGS]{{}}", f"[TOOL_CALLS]{LONG_NAME}[ARGS]{{}}", []),
        ('[TOOL_CALLS]f[ARGS]{"q": 1}[TOOL_CALLS] no', "[TOOL_CALLS] no", [("f", '{"q": 1}')]),
    ],
)
def test_name_then_args_calls(text: str, content: str, calls: list[tuple[str, str]]) -> None:
    whole = parse_every_way("mistral", text)
    assert (whole.content, calls_of(whole)) == (content, calls)
