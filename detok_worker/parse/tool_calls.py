"""Tool calls written as JSON objects in the text: hermes/qwen (`<tool_call>{...}</tool_call>`), llama3 JSON
(`<|python_tag|>{...}; {...}` or a bare `{...}` output) and mistral (`[TOOL_CALLS][{...}, {...}]`, and the v11+
`[TOOL_CALLS]name[ARGS]{...}`), and the outputs a chat `tool_choice` forces: "required" (a JSON array of
`{"name", "parameters"}` objects) and a named function (the output is its arguments).

Text outside the calls is content. Each call streams as: its name (first piece), then its arguments JSON as the
model writes it (`JsonCallScanner`). A call stands once it names a function (it has been streamed); cut off by the end
of the output, it keeps what was streamed. No text vanishes: what is not markup of a call is content. An object that
ends, breaks or is cut off before it names a function was not a call: its text (with the markup before it) is
content. Markup that is held until what follows shows what it is (`_unnamed`): the opening marker and whitespace
before the first call, and whitespace plus one separator between calls.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from enum import Enum

from detok_worker.parse.base import ParsedOutput, TextStage, held_suffix_len, trailing_space
from detok_worker.parse.json_call import JSON_SPACE, JsonCallScanner

_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")
_MAX_NAME_CHARS = 64  # OpenAI's limit on a function name; a longer word after `[TOOL_CALLS]` is no call
_KIMI_CALL_ID = re.compile(r".+:\d+")  # the start of a Kimi-K2 call header, its call id: `functions.NAME:IDX`


class _In(Enum):
    TEXT = 1  # content, looking for the opening marker
    CALL = 2  # inside a call object
    AFTER_CALL = 3  # the object ended: skipping to the closing marker / the next call
    START = 4  # llama3: the output has not shown yet whether it is a call
    NAME = 5  # mistral v11+: the function name, up to `[ARGS]` (or `[CALL_ID]`)
    CALL_ID = 6  # mistral v11+: the call id, up to `[ARGS]`
    ARGS = 7  # mistral v11+: after `[ARGS]`, before the arguments object


class _JsonCallsStage(TextStage):
    """What the JSON call stages share: the held text, the call being scanned, the count of calls, and the text
    not yet known to be markup or content (`_unnamed`): the markup since the opening marker or the last call, and
    an object that has not named a function yet. A named call makes it markup; anything else makes it content."""

    def __init__(self, start: _In = _In.TEXT) -> None:
        self._in = start
        self._calls = 0
        self._group_calls = 0  # calls since the opening marker (llama3: in the output)
        self._separated = False  # a separator was read since the last call
        self._scanner: JsonCallScanner | None = None
        self._unnamed = ""

    def _start_call(self, name: str | None = None) -> None:
        self._scanner = JsonCallScanner(self._calls, name)
        self._in = _In.CALL

    def _not_a_call(self, out: ParsedOutput) -> None:
        """What was held as possible markup was not: it is content, and the text goes on as text."""
        out.content += self._unnamed
        self._unnamed = ""
        self._in = _In.TEXT

    def _after_call(self, broken: bool) -> _In:
        """Where the text goes on after a named call: one that broke ends the calls (the character that broke it
        and what follows are content)."""
        return _In.TEXT if broken else _In.AFTER_CALL

    def _after_unnamed(self) -> _In:
        """Where the text goes on after an object that was not a call."""
        return _In.TEXT if self._group_calls == 0 else _In.AFTER_CALL

    def _feed_call(self, buffer: str, out: ParsedOutput) -> str:
        """Feed the call being scanned; returns the text after it (once it ended)."""
        scanner = self._scanner
        assert scanner is not None
        rest = buffer[scanner.feed(buffer, out) :]
        if scanner.name is not None:
            self._unnamed = ""
            if scanner.done or scanner.broken:
                self._calls += 1
                self._group_calls += 1
                self._separated = False
                self._in = self._after_call(scanner.broken)
        elif scanner.done or scanner.broken:
            out.content += self._unnamed + buffer[: len(buffer) - len(rest)]
            self._unnamed = ""
            self._separated = False
            self._in = self._after_unnamed()
        else:
            self._unnamed += buffer
        return rest

    def _between_calls(self, buffer: str, out: ParsedOutput, separator: str, closer: str = "") -> str:
        """After the opening markup or a call: whitespace and (after a call) one `separator` are markup if "{"
        opens a call next, or if `closer` ends the calls (after a call); any other character ends the calls, and
        the markup read since the last call is content with it."""
        char = buffer[0]
        if char in JSON_SPACE or (char == separator and self._group_calls and not self._separated):
            self._separated = self._separated or char == separator
            self._unnamed += char
            return buffer[1:]
        if char == "{":
            self._start_call()
            return buffer
        if char == closer and self._group_calls:
            self._unnamed = ""
            self._in = _In.TEXT
            return buffer[1:]
        self._not_a_call(out)
        return buffer

    def finish(self, out: ParsedOutput) -> None:
        held, self._held = self._held, ""
        if self._in is _In.CALL and self._scanner is not None:
            self._scanner.finish(out)
        if self._in is _In.AFTER_CALL and self._group_calls:
            self._unnamed = ""  # the output ended after a call: what follows it was markup
        out.content += self._unnamed + (held if self._in is not _In.AFTER_CALL else "")  # not a partial closing marker
        self._unnamed = ""


class TaggedJsonCalls(_JsonCallsStage):
    """Calls between an opening and a closing marker, e.g. hermes `<tool_call>` ... `</tool_call>`.

    A named call stands (it has been streamed). Inside its block, whitespace around the object is markup; any
    other text after the object (junk, or the character that broke the object and what follows it) is content, up
    to the closing marker. A block whose closing marker is missing ends at the next opening marker."""

    def __init__(self, open_marker: str, close_marker: str) -> None:
        super().__init__()
        self.open_marker = open_marker
        self.close_marker = close_marker
        self._text_after_call = False  # content was found in the block after its call object

    def _after_call(self, broken: bool) -> _In:
        return _In.AFTER_CALL  # a call that broke stays in its block, up to the closing marker

    def _open_call(self, marker: str) -> None:
        self._start_call()
        self._unnamed = marker
        self._text_after_call = False

    def _after_unnamed(self) -> _In:
        return _In.TEXT  # the closing marker of a call that was none is content too

    def _step(self, buffer: str, out: ParsedOutput) -> str:
        if self._in is _In.TEXT:
            before, marker, rest = self._cut(buffer, (self.open_marker,))
            out.content += before
            if marker:
                self._open_call(marker)
            return rest
        if self._in is _In.CALL:
            return self._feed_call(buffer, out)
        before, marker, rest = self._cut(buffer, (self.close_marker, self.open_marker))
        if not self._text_after_call:
            before = before.lstrip(JSON_SPACE)
        if before:
            out.content += before
            self._text_after_call = True
        if marker == self.open_marker:
            self._open_call(marker)
        elif marker:
            self._in = _In.TEXT
        return rest


class MistralCalls(_JsonCallsStage):
    """`[TOOL_CALLS]` then either a JSON array of call objects (or bare objects), or (mistral-common tokenizer v11+:
    Mistral Small 3.2, Magistral, Devstral) one call written `name[ARGS]{...}` or `name[CALL_ID]id[ARGS]{...}`,
    each call with its own marker. The first character after the marker (and whitespace) tells which. Text before
    the marker (and after the calls) is content.

    When what follows the marker is not a list that starts with a named call, nor a name (letters, digits, "_",
    "-", ".", at most 64) then `[ARGS]` then an object, the marker and it are content (as vLLM keeps an output
    whose calls do not parse). Between calls in the list, whitespace and one "," are markup when a call or the
    closing "]" follows; any other text ends the calls and is content from the last call on (the "," included).
    A v11 call's id is markup (the front makes the ids)."""

    MARKER = "[TOOL_CALLS]"
    ARGS = "[ARGS]"
    CALL_ID = "[CALL_ID]"

    def __init__(self) -> None:
        super().__init__()
        self._in_array = False
        self._name_first = False  # the v11 format
        self._name = ""
        self._word_chars = 0  # of the name or call id being read

    def _after_call(self, broken: bool) -> _In:
        return _In.TEXT if self._name_first else super()._after_call(broken)  # v11: one call per marker

    def _step(self, buffer: str, out: ParsedOutput) -> str:
        if self._in is _In.TEXT:
            before, marker, rest = self._cut(buffer, (self.MARKER,))
            out.content += before
            if marker:
                self._in, self._in_array, self._name_first, self._unnamed = _In.AFTER_CALL, False, False, marker
                self._group_calls, self._separated = 0, False
            return rest
        if self._in is _In.CALL:
            return self._feed_call(buffer, out)
        if self._in is _In.NAME or self._in is _In.CALL_ID:
            return self._name_or_call_id(buffer, out)
        if self._in is _In.ARGS:
            return self._arguments_start(buffer, out)
        return self._after_marker_or_call(buffer, out)

    def _after_marker_or_call(self, buffer: str, out: ParsedOutput) -> str:
        if not self._in_array and not self._group_calls:  # right after the marker: which format
            if buffer[0] == "[":
                self._in_array = True
                self._unnamed += "["
                return buffer[1:]
            if buffer[0] in _NAME_CHARS:
                self._in, self._name_first, self._name, self._word_chars = _In.NAME, True, "", 0
                return buffer
        if self._in_array:
            return self._between_calls(buffer, out, ",", "]")
        return self._between_calls(buffer, out, "")

    def _name_or_call_id(self, buffer: str, out: ParsedOutput) -> str:
        """v11: the name, up to `[ARGS]` or `[CALL_ID]`; or the call id, up to `[ARGS]`."""
        size = 0
        while size < len(buffer) and buffer[size] in _NAME_CHARS and self._word_chars + size < _MAX_NAME_CHARS:
            size += 1
        if self._in is _In.NAME:
            self._name += buffer[:size]
        self._word_chars += size
        self._unnamed += buffer[:size]
        rest = buffer[size:]
        if not rest:
            return ""
        markers = (self.ARGS, self.CALL_ID) if self._in is _In.NAME else (self.ARGS,)
        for marker in markers:
            if rest.startswith(marker) and self._word_chars:
                self._in = _In.ARGS if marker == self.ARGS else _In.CALL_ID
                self._unnamed += marker
                self._word_chars = 0
                return rest[len(marker) :]
        if held_suffix_len(rest, markers) == len(rest):
            self._held = rest  # it may still become the marker
            return ""
        self._not_a_call(out)
        return rest

    def _arguments_start(self, buffer: str, out: ParsedOutput) -> str:
        """v11, after `[ARGS]`: an object makes the call (its name is known now); anything else makes none."""
        char = buffer[0]
        if char in JSON_SPACE:
            self._unnamed += char
            return buffer[1:]
        if char != "{":
            self._not_a_call(out)
            return buffer
        out.add_tool(self._calls, name=self._name)
        self._start_call(self._name)
        return buffer


class _Delimited(Enum):
    TEXT = 1  # content, looking for the opening marker of the calls
    SECTION = 2  # between calls: markup, looking for a call's opening marker
    NAME = 3  # a call's name, up to the marker before its arguments
    ARGUMENTS = 4  # a call's arguments, up to its closing marker


class DelimitedCalls(TextStage):
    """Calls written between special-token markers, each a name then its arguments as the model writes them:
    DeepSeek-V3.1's `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>name<｜tool▁sep｜>{...}<｜tool▁call▁end｜>...
    <｜tool▁calls▁end｜>`. Text before the calls' opening marker is content; after it, everything but the calls is
    markup (as vLLM's parser of the family reads a whole output: the content is the text before the calls). A call
    stands once its name is complete (the marker after it came); cut off by the end of the output, it keeps what
    was streamed of its arguments.

    With `calls_end`, the rules of vLLM 0.32's parser engine (Kimi-K2: `<|tool_calls_section_begin|>
    <|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{...}<|tool_call_end|>...
    <|tool_calls_section_end|>`): a call's header runs up to the marker before its arguments (other markers are
    part of it) and `call_name` takes the function's name and the call's id from it (None: the header names none,
    no call); the arguments end at the call's closing marker or at `calls_end`, trimmed (held while they may be
    trailing whitespace), `{}` when there are none; a header the end of the output cuts off still makes a call when
    it names one; and content that is only whitespace is dropped when a call's opening marker follows it (held until
    then)."""

    def __init__(
        self,
        begin: str,
        call_begin: str,
        name_end: str,
        call_end: str,
        *,
        calls_end: str = "",
        call_name: Callable[[str], tuple[str, str] | None] | None = None,
    ) -> None:
        self._begin, self._call_begin, self._name_end, self._call_end = begin, call_begin, name_end, call_end
        self._engine = bool(calls_end)
        self._name_markers = (name_end,) if calls_end else (name_end, call_end)
        self._arguments_end = (call_end, calls_end) if calls_end else (call_end,)
        self._call_name = call_name
        self._in = _Delimited.TEXT
        self._name = ""
        self._named = False  # the call being read names a function (else its arguments are markup)
        self._argued = False  # the call's arguments have begun (engine: past their leading whitespace)
        self._space = ""  # engine: the arguments' trailing whitespace
        self._blank = ""  # engine: the content while it is only whitespace
        self._content_begun = False
        self._calls = 0

    def _step(self, buffer: str, out: ParsedOutput) -> str:
        if self._in is _Delimited.TEXT:
            before, marker, rest = self._cut(buffer, (self._begin,))
            self._content(before, out)
            if marker:
                self._in = _Delimited.SECTION
        elif self._in is _Delimited.SECTION:
            _, marker, rest = self._cut(buffer, (self._call_begin,))
            if marker:  # a call follows: content that is only whitespace is none
                self._in, self._name, self._blank = _Delimited.NAME, "", ""
        elif self._in is _Delimited.NAME:
            before, marker, rest = self._cut(buffer, self._name_markers)
            self._name += before
            if marker == self._name_end:
                self._open_call(out)
                self._in = _Delimited.ARGUMENTS
            elif marker:  # no arguments marker: not a call
                self._in = _Delimited.SECTION
        else:
            before, marker, rest = self._cut(buffer, self._arguments_end)
            self._argue(before, out)
            if marker:
                self._close_call(out)
                self._in = _Delimited.SECTION
        return rest

    def _content(self, text: str, out: ParsedOutput) -> None:
        if self._engine and not self._content_begun:
            text = self._blank + text
            if not text.strip():
                self._blank = text
                return
            self._blank, self._content_begun = "", True
        out.content += text

    def _open_call(self, out: ParsedOutput) -> None:
        named = self._call_name(self._name) if self._call_name is not None else (self._name, "")
        self._named, self._argued, self._space = named is not None, False, ""
        if named is not None:
            out.add_tool(self._calls, name=named[0], call_id=named[1])

    def _argue(self, text: str, out: ParsedOutput) -> None:
        if not (self._named and text):
            return
        if self._engine:
            text, self._space = trailing_space(self._space, text if self._argued else text.lstrip())
        if text:
            self._argued = True
            out.add_tool(self._calls, arguments=text)

    def _close_call(self, out: ParsedOutput) -> None:
        if not self._named:
            return
        if self._engine and not self._argued:
            out.add_tool(self._calls, arguments="{}")
        self._calls += 1
        self._named, self._space = False, ""

    def finish(self, out: ParsedOutput) -> None:
        held, self._held = self._held, ""
        if self._in is _Delimited.TEXT:
            self._content(held, out)
        elif self._in is _Delimited.ARGUMENTS:
            self._argue(held, out)
            if self._engine:
                self._close_call(out)
        elif self._in is _Delimited.NAME and self._engine:
            self._name += held
            self._open_call(out)
            self._close_call(out)
        out.content += self._blank
        self._blank = ""


def kimi_call_name(header: str) -> tuple[str, str] | None:
    """The function a Kimi-K2 call header (`functions.NAME:IDX`) names and the call's id, as vLLM 0.32 reads them:
    the header must start with an id (its first line up to its last `:` and digits), which is the call's id; the
    name is the part before its first `:`, without `functions.`. None when the header has no id or the name is
    empty."""
    header = header.strip()
    call_id = _KIMI_CALL_ID.match(header)
    if call_id is None:
        return None
    name = header.split(":")[0].removeprefix("functions.").strip()
    return (name, call_id.group().strip()) if name else None


class _OutputCalls(_JsonCallsStage):
    """Calls that make the whole output, with no marker around each: the output's opening (`_opening`) shows
    whether it is calls: leading whitespace, then OPENER (optional unless OPENER_REQUIRED); between calls,
    whitespace and one SEPARATOR are markup, and CLOSER ends them."""

    OPENER = ""
    OPENER_REQUIRED = False
    SEPARATOR = ""
    CLOSER = ""

    def __init__(self) -> None:
        super().__init__(_In.START)

    def _step(self, buffer: str, out: ParsedOutput) -> str:
        if self._in is _In.TEXT:
            out.content += buffer
            return ""
        if self._in is _In.CALL:
            return self._feed_call(buffer, out)
        if self._in is _In.START:
            return self._opening(buffer, out)
        return self._between_calls(buffer, out, self.SEPARATOR, self.CLOSER)

    def _opening(self, buffer: str, out: ParsedOutput) -> str:
        """The output's leading whitespace and OPENER: kept (in `_unnamed`) until a call is named."""
        stripped = buffer.lstrip(JSON_SPACE)
        self._unnamed += buffer[: len(buffer) - len(stripped)]
        if len(stripped) < len(self.OPENER) and self.OPENER.startswith(stripped):
            self._held = stripped  # it may still become the opener
            return ""
        if stripped.startswith(self.OPENER):
            self._unnamed += self.OPENER
            self._in = _In.AFTER_CALL
            return stripped[len(self.OPENER) :]
        if self.OPENER_REQUIRED:
            self._not_a_call(out)
        else:
            self._in = _In.AFTER_CALL
        return stripped


class Llama3JsonCalls(_OutputCalls):
    """Llama 3.x JSON calls: the output is calls when it starts with `<|python_tag|>` or `{` (leading whitespace
    allowed) and its first object names a function, several separated by whitespace and at most one `;`; any other
    output is content (the tag included, as vLLM keeps an output whose calls do not parse). Text after the calls
    that is not such markup ends them and is content from the last call on (a `;` included)."""

    OPENER = "<|python_tag|>"
    SEPARATOR = ";"


class RequiredCalls(_OutputCalls):
    """tool_choice "required": the output is a JSON array of `{"name": ..., "parameters": {...}}` objects (the
    request's schema constrains it, vLLM's schema), each a call whose arguments are its parameters as written
    (vLLM streams them so). Whitespace and "," between the calls and the array's brackets are markup; an output
    that is no such array is content, as is text after the array."""

    OPENER = "["
    OPENER_REQUIRED = True
    SEPARATOR = ","
    CLOSER = "]"


class NamedCall(TextStage):
    """tool_choice names a function: the whole output is one call to it, the text its arguments (the function's
    parameters schema constrains it); the call's first piece names it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._named = False

    def feed(self, text: str, out: ParsedOutput) -> None:
        out.add_tool(0, name="" if self._named else self.name, arguments=text)
        self._named = True

    def finish(self, out: ParsedOutput) -> None:
        return None
