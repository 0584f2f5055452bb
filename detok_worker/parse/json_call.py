"""An incremental scanner of one JSON tool-call object, `{"name": "f", "arguments": {...}}`, character by
character: it reports the name once it is complete and streams the arguments value as it is written, so the
concatenated fragments are exactly the model's arguments JSON (key order free: arguments written before the name
are held until the name is known). Other keys are skipped. It never builds the whole object. For a format that
writes the name before a bare arguments object (Mistral v11+), it scans that object alone.
"""

from __future__ import annotations

import json
from enum import Enum

from detok_worker.parse.base import ParsedOutput

NAME_KEYS = frozenset({"name"})
ARGUMENT_KEYS = frozenset({"arguments", "parameters"})
JSON_SPACE = " \t\r\n"  # the whitespace JSON allows between tokens


class _At(Enum):
    BEFORE_OBJECT = 1
    BEFORE_KEY = 2  # after "{" or ","
    KEY = 3
    BEFORE_COLON = 4
    BEFORE_VALUE = 5
    VALUE = 6
    AFTER_VALUE = 7
    DONE = 8
    BROKEN = 9


class JsonCallScanner:
    """Scans one call object; `done` once its closing brace is read, `broken` on text that is not such an object.
    With `name` (already reported by the caller), it scans the call's arguments object alone."""

    def __init__(self, index: int, name: str | None = None) -> None:
        self.index = index
        self.name = name
        self._arguments_only = name is not None
        self._at = _At.BEFORE_VALUE if self._arguments_only else _At.BEFORE_OBJECT
        self._key = "arguments" if self._arguments_only else ""
        self._value = ""  # the raw text of the current value so far (kept only for the name)
        self._depth = 0  # nesting inside the current value
        self._in_string = False
        self._escaped = False
        self._streaming = False  # the current value is the arguments
        self._pending_args = ""  # arguments seen before the name
        self._value_chars = 0
        self._has_args = False  # an arguments value was written

    @property
    def done(self) -> bool:
        return self._at is _At.DONE

    @property
    def broken(self) -> bool:
        return self._at is _At.BROKEN

    def feed(self, text: str, out: ParsedOutput) -> int:
        """Consume characters of `text` until the object is complete or breaks; returns how many were consumed
        (never the character that breaks it)."""
        args: list[str] = []
        consumed = len(text)
        for position, char in enumerate(text):
            if self._at is _At.DONE:
                consumed = position
                break
            named = self.name is not None
            self._step(char, args)
            if self._at is _At.BROKEN:
                consumed = position  # the breaking character is not the call's: the stage decides what it is
                break
            if not named and self.name is not None:  # the call's first piece: its name, and arguments so far
                out.add_tool(self.index, name=self.name, arguments=self._pending_args + "".join(args))
                self._pending_args = ""
                args.clear()
        fragment = "".join(args)
        if self.name is None:
            self._pending_args += fragment
        elif fragment:
            out.add_tool(self.index, arguments=fragment)
        if self.done or self.broken:
            self.finish(out)
        return consumed

    def finish(self, out: ParsedOutput) -> None:
        """The object ended (or the output did): a named call that wrote no arguments has `{}`, as clients
        json.loads the arguments (vLLM does the same)."""
        if self.name is not None and not self._has_args:
            self._has_args = True
            out.add_tool(self.index, arguments="{}")

    def _step(self, char: str, args: list[str]) -> None:
        at = self._at
        if at is _At.VALUE:
            self._value_char(char, args)
        elif at is _At.KEY:
            self._value += char
            self._string_char(char)
            if not self._in_string:
                try:
                    self._key = json.loads(self._value)
                except ValueError:  # an invalid escape
                    self._at = _At.BROKEN
                    return
                self._value = ""
                self._at = _At.BEFORE_COLON
        elif char in JSON_SPACE:
            return
        elif at is _At.BEFORE_OBJECT:
            self._at = _At.BEFORE_KEY if char == "{" else _At.BROKEN
        elif at is _At.BEFORE_KEY:
            if char == '"':
                self._at, self._in_string, self._value = _At.KEY, True, '"'
            else:
                self._at = _At.DONE if char == "}" else _At.BROKEN
        elif at is _At.BEFORE_COLON:
            self._at = _At.BEFORE_VALUE if char == ":" else _At.BROKEN
        elif at is _At.BEFORE_VALUE:
            self._at = _At.VALUE
            self._streaming = self._key in ARGUMENT_KEYS
            self._value_chars = 0
            self._value_char(char, args)
        elif at is _At.AFTER_VALUE:
            self._at = _At.BEFORE_KEY if char == "," else (_At.DONE if char == "}" else _At.BROKEN)

    def _string_char(self, char: str) -> None:
        if self._escaped:
            self._escaped = False
        elif char == "\\":
            self._escaped = True
        elif char == '"':
            self._in_string = False

    def _value_char(self, char: str, args: list[str]) -> None:
        """One character of a value: strings, nesting, and the end of a bare value (number, true, null)."""
        if self._in_string:
            self._string_char(char)
        elif self._depth == 0 and self._value_chars and (char in JSON_SPACE or char in ",}"):
            self._end_value()  # a bare value ends at the first character that is not part of it
            self._step(char, args)
            return
        elif char == '"':
            self._in_string = True
        elif char in "{[":
            self._depth += 1
        elif char in "}]":
            self._depth -= 1
        self._value_chars += 1
        if self._streaming:
            self._has_args = True
            args.append(char)
        elif self._key in NAME_KEYS:
            self._value += char
        if self._depth == 0 and not self._in_string and (char in '}]"'):
            self._end_value()

    def _end_value(self) -> None:
        if self._key in NAME_KEYS and self.name is None:
            try:
                name = json.loads(self._value)
            except ValueError:
                name = None
            self.name = name if isinstance(name, str) else None
        self._value = ""
        self._streaming = False
        self._at = _At.DONE if self._arguments_only else _At.AFTER_VALUE
