"""Tool calls written as JSON objects in the text: hermes/qwen (`<tool_call>{...}</tool_call>`), llama3 JSON
(`<|python_tag|>{...}; {...}` or a bare `{...}` output) and mistral (`[TOOL_CALLS][{...}, {...}]`).

Text outside the calls is content. Each call streams as: its name (first piece), then its arguments JSON as the
model writes it (json_call.py). A call cut off by the end of the output keeps what was streamed; a hermes call
that ends, breaks or is cut off before it names a function was not one: its marker and text are content.
"""

from __future__ import annotations

from enum import Enum

from detok_worker.parse.base import ParsedOutput, TextStage
from detok_worker.parse.json_call import JsonCallScanner
from detok_worker.parse.markers import split_before_marker

_SPACE = " \t\r\n"


class _In(Enum):
    TEXT = 1  # content, looking for the opening marker
    CALL = 2  # inside a call object
    AFTER_CALL = 3  # the object ended: skipping to the closing marker / the next call
    START = 4  # llama3: the output has not shown yet whether it is a call


class _JsonCallsStage(TextStage):
    """What the JSON call stages share: the held text, the call being scanned, the count of calls."""

    def __init__(self, start: _In = _In.TEXT) -> None:
        self._in = start
        self._held = ""
        self._calls = 0
        self._scanner: JsonCallScanner | None = None

    def _start_call(self) -> None:
        self._scanner = JsonCallScanner(self._calls)
        self._in = _In.CALL

    def _feed_call(self, buffer: str, out: ParsedOutput) -> str:
        """Feed the call being scanned; returns the text after it (once it ended)."""
        scanner = self._scanner
        assert scanner is not None
        used = scanner.feed(buffer, out)
        if scanner.done or scanner.broken:
            self._calls += scanner.name is not None
            self._in = _In.AFTER_CALL
        return buffer[used:]

    def finish(self, out: ParsedOutput) -> None:
        held, self._held = self._held, ""
        if self._in in (_In.TEXT, _In.START):
            out.content += held


class TaggedJsonCalls(_JsonCallsStage):
    """Calls between an opening and a closing marker, e.g. hermes `<tool_call>` ... `</tool_call>`. With a list
    opener (mistral's `[TOOL_CALLS]` followed by `[`), the calls are the elements of one JSON array."""

    def __init__(self, open_marker: str, close_marker: str) -> None:
        super().__init__()
        self.open_marker = open_marker
        self.close_marker = close_marker
        self._unnamed = ""  # the marker and the call's text while it has no name: content if it never gets one

    def feed(self, text: str, out: ParsedOutput) -> None:
        buffer = self._held + text
        self._held = ""
        while buffer:
            if self._in is _In.TEXT:
                before, marker, rest = split_before_marker(buffer, (self.open_marker,))
                out.content += before
                if not marker:
                    self._held = rest
                    return
                self._start_call()
                self._unnamed = marker
                buffer = rest
            elif self._in is _In.CALL:
                buffer = self._feed_unnamed(buffer, out) if self._unnamed else self._feed_call(buffer, out)
            else:
                before, marker, rest = split_before_marker(buffer, (self.close_marker,))
                if not marker:
                    self._held = rest
                    return
                self._in = _In.TEXT
                buffer = rest

    def _feed_unnamed(self, buffer: str, out: ParsedOutput) -> str:
        """Feed a call that has no name yet. One that ends (or breaks) before it names a function was not a call:
        its marker and text are content, like the rest of the output up to the next opening marker."""
        rest = self._feed_call(buffer, out)
        assert self._scanner is not None
        if self._scanner.name is not None:
            self._unnamed = ""
        elif self._in is _In.AFTER_CALL:
            out.content += self._unnamed + buffer[: len(buffer) - len(rest)]
            self._unnamed, self._in = "", _In.TEXT
        else:
            self._unnamed += buffer
        return rest

    def finish(self, out: ParsedOutput) -> None:
        if self._in is _In.CALL and self._unnamed:  # the output ended before the call named a function
            out.content += self._unnamed
            self._unnamed = ""
        super().finish(out)


class MistralCalls(_JsonCallsStage):
    """`[TOOL_CALLS]` then a JSON array of call objects; text before the marker (and after the array) is content."""

    MARKER = "[TOOL_CALLS]"

    def __init__(self) -> None:
        super().__init__()
        self._in_array = False

    def feed(self, text: str, out: ParsedOutput) -> None:
        buffer = self._held + text
        self._held = ""
        while buffer:
            if self._in is _In.TEXT:
                before, marker, rest = split_before_marker(buffer, (self.MARKER,))
                out.content += before
                if not marker:
                    self._held = rest
                    return
                self._in, self._in_array = _In.AFTER_CALL, False
                buffer = rest
            elif self._in is _In.CALL:
                buffer = self._feed_call(buffer, out)
            else:
                buffer = self._between_calls(buffer, out)

    def _between_calls(self, buffer: str, out: ParsedOutput) -> str:
        """After the marker or a call: "[" opens the array, "{" a call, "," separates, "]" ends the calls."""
        char = buffer[0]
        if char in _SPACE or (char == "," and self._in_array):
            return buffer[1:]
        if char == "[" and not self._in_array:
            self._in_array = True
            return buffer[1:]
        if char == "{":
            self._start_call()
            return buffer
        self._in = _In.TEXT
        return buffer[1:] if char == "]" else buffer


class Llama3JsonCalls(_JsonCallsStage):
    """Llama 3.x JSON calls: the output is calls when it starts with `<|python_tag|>` or `{` (leading whitespace
    allowed), several separated by `;`; any other output is content."""

    TAG = "<|python_tag|>"

    def __init__(self) -> None:
        super().__init__(_In.START)

    def feed(self, text: str, out: ParsedOutput) -> None:
        buffer = self._held + text
        self._held = ""
        while buffer:
            if self._in is _In.TEXT:
                out.content += buffer
                return
            if self._in is _In.CALL:
                buffer = self._feed_call(buffer, out)
                continue
            stripped = buffer.lstrip(_SPACE)
            if self._in is _In.START and self.TAG.startswith(stripped) and len(stripped) < len(self.TAG):
                self._held = buffer  # it may still become the tag
                return
            if self._in is _In.START and stripped.startswith(self.TAG):
                stripped = stripped[len(self.TAG) :].lstrip(_SPACE)
                self._in = _In.AFTER_CALL
            if not stripped:
                self._held = "" if self._in is _In.AFTER_CALL else buffer
                return
            if self._in is _In.AFTER_CALL and stripped[0] == ";":
                buffer = stripped[1:]
            elif stripped[0] == "{":
                self._start_call()
                buffer = stripped
            else:
                self._in = _In.TEXT
                out.content += buffer if self._calls == 0 else stripped
                return
