"""Tool calls whose arguments are XML-style parameters, as vLLM 0.32's engine-based parsers of four families read
them (vllm/parser/qwen3.py, glm47_moe.py, minimax_m2.py, deepseek_v32.py over vllm/parser/engine/):

- qwen3_coder (Qwen3-Coder, Qwen3.5): `<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n
  </function>\\n</tool_call>`;
- glm45 / glm47 (GLM-4.5 to 4.7, one parser in vLLM): `<tool_call>NAME\\n<arg_key>KEY</arg_key>\\n<arg_value>VALUE
  </arg_value>\\n</tool_call>`;
- minimax_m2: `<minimax:tool_call>\\n<invoke name="NAME">\\n<parameter name="KEY">VALUE</parameter>\\n</invoke>\\n
  </minimax:tool_call>`;
- deepseek_v32 (DeepSeek-V3.2's DSML): `<｜DSML｜function_calls>\n<｜DSML｜invoke name="NAME">\n<｜DSML｜parameter
  name="KEY" string="true">VALUE</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>`: a value whose
  `string` attribute is not "true" (or is missing) is JSON where it parses as such, else text, and the schema type
  then fits either (tool_types.loaded_value_json); calls may name any function; the content before the calls keeps
  its trailing whitespace.

The text is cut at the family's markers (the longest at the earliest place; a marker is held while the text's end may
still become one), and each marker moves a small state machine (`XmlFamily.steps`); a marker that means nothing
where it stands is text there. Reasoning markers are text (vLLM's tool parser when no reasoning parser is named).

A call is named by the text up to the marker that ends its name, stripped; a call without a name is none, and glm and
minimax take only the names of the request's tools (when it has tools). Its arguments are the text up to its closing
marker (or the end of the output), read as the family's parameters (`_ParameterReader`: vLLM's pattern over that
text), each value made JSON by its schema type (`ToolTypes`), in `json.dumps`'s spacing. Text outside the calls is
content, but once a call stands the content is the text before the first call only (vLLM keeps no other), without
its trailing whitespace; whitespace alone beside calls is no content.

Streaming: a call's first piece is its name with the arguments' "{"; a parameter goes out once it is certain: a
string value (its schema says string, or nothing) as it is written, another value when its closing tag came; the
call's "}" when it ends. The pieces concatenate to the final arguments.

Where detok differs from vLLM's parse of a whole output: a string value whose closing tag never comes (the output or
its call ends inside it) is kept as streamed, closed (vLLM drops the parameter, after its streaming sent the text
unclosed); whitespace before the content's first text stays when calls come after that text (as vLLM's streaming
sends it); content between a call that is none and a later call that stands stays (vLLM keeps none after the first
call's opening); a parameter named twice is written twice (`json.loads` keeps the last value, as vLLM's object
has it, there at the first one's place). Not read as vLLM reads them: a call without a name whose arguments are a
JSON object naming one (vLLM's fallback makes it a call), special tokens other than the markers (vLLM drops them;
the worker leaves them out only when it skips special tokens), a parameter tag inside a MiniMax key's quotes. In
deepseek_v32: a value that parses to JSON holding an infinity or NaN is its text as a string (vLLM writes
`Infinity`, no JSON), an object or array value's members are not fitted to a nested schema (the worker has the
top-level types only), and arguments that are a lone `arguments` or `input` member wrapping the tool's parameters
are not unwrapped (vLLM's V3.2 parser unwraps them after the fact, which a stream that already sent them cannot).
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from detok_worker.parse.base import ParsedOutput, TextStage, held_suffix_len, trailing_space
from detok_worker.parse.tool_types import ToolTypes, is_text, loaded_value_json, value_json

_NOT_PATTERN_SPACE = frozenset("\x1c\x1d\x1e\x1f")  # str.isspace() counts them; the patterns' \s (regex) does not


class _Match(Enum):
    FULL = 1
    PARTIAL = 2  # the text ends before it can tell
    NONE = 3


def _is_space(char: str) -> bool:
    return char.isspace() and char not in _NOT_PATTERN_SPACE


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and _is_space(text[at]):
        at += 1
    return at


def _match(text: str, at: int, pattern: Sequence[str]) -> tuple[_Match, int]:
    """Whether `pattern` matches `text` at `at`, and where the match ends: literals, "" for optional whitespace and
    " " for some whitespace (a pattern's \\s* and \\s+)."""
    for part in pattern:
        if part in ("", " "):
            start, at = at, _skip_space(text, at)
            if at == len(text):
                return _Match.PARTIAL, at
            if part == " " and at == start:
                return _Match.NONE, at
            continue
        piece = text[at : at + len(part)]
        if not part.startswith(piece):
            return _Match.NONE, at
        if len(piece) < len(part):
            return _Match.PARTIAL, at
        at += len(part)
    return _Match.FULL, at


def _decided(status: _Match, *, final: bool) -> _Match:
    """At the end of the text nothing is partial any more."""
    return _Match.NONE if final and status is _Match.PARTIAL else status


class _Arguments:
    """One call's arguments as JSON text, written as its parameters are read (after the "{" of the call's first
    piece): `"key": value` members, a string value as it comes, another one when complete."""

    def __init__(self, typed: Mapping[str, tuple[str, ...]]) -> None:
        self._typed = typed
        self._pieces: list[str] = []
        self._members = 0
        self._key: str | None = None  # the parameter being read (None: none, or one that is dropped)
        self._types: tuple[str, ...] | None = None
        self._value = ""  # a value that is not a string, so far
        self._opened = False  # a string value's opening quote is written
        self._loaded = False

    def start(self, key: str, *, loaded: bool = False) -> None:
        """`loaded`: the value is JSON where it parses as such (else text) before its schema type converts it."""
        self._key, self._types, self._value, self._opened = key, self._typed.get(key), "", False
        self._loaded = loaded

    def add(self, text: str) -> None:
        if self._key is None or not text:
            return
        if self._loaded or not is_text(self._types):
            self._value += text
            return
        if not self._opened:
            self._member('"')
            self._opened = True
        self._pieces.append(json.dumps(text, ensure_ascii=False)[1:-1])

    def close(self) -> None:
        if self._key is None:
            return
        if self._loaded:
            self._member(loaded_value_json(self._value, self._types))
        elif not is_text(self._types):
            assert self._types is not None
            self._member(value_json(self._value, self._types))
        elif self._opened:
            self._pieces.append('"')
        else:
            self._member('""')
        self._key = None

    def drop(self) -> None:
        """The parameter's closing tag never came: it is none (vLLM's), but a string already streamed is closed."""
        if self._key is not None and self._opened:
            self._pieces.append('"')
        self._key = None

    def take(self) -> str:
        text = "".join(self._pieces)
        self._pieces.clear()
        return text

    def _member(self, value: str) -> None:
        assert self._key is not None
        separator = ", " if self._members else ""
        self._pieces.append(f"{separator}{json.dumps(self._key, ensure_ascii=False)}: {value}")
        self._members += 1


class _ParameterReader(ABC):
    """Reads a call's arguments text into parameters, one after the other (text between them is ignored), as the
    family's regular expression reads the whole text; holds what may still be a tag."""

    def __init__(self, arguments: _Arguments) -> None:
        self.arguments = arguments
        self._pending = ""
        self._in_value = False

    def feed(self, text: str) -> None:
        self._pending = self._scan(self._pending + text, final=False)

    def end(self) -> None:
        """The call's arguments ended: what is held is what it is, and a value still open is dropped."""
        self._scan(self._pending, final=True)
        self._pending = ""
        if self._in_value:
            self.arguments.drop()
            self._in_value = False

    @abstractmethod
    def _scan(self, text: str, *, final: bool) -> str:
        """Read `text`; return what is held."""

    def _value(self, text: str) -> None:
        self.arguments.add(text)

    def _close(self) -> None:
        self.arguments.close()
        self._in_value = False


_PARAMETER_CLOSE = ("<", "", "/", "", "parameter", "", ">")


class _TaggedParameters(_ParameterReader):
    """Parameters opened by a tag (OPENING, then the family's key and ">") whose value runs to `</parameter>` or to
    the next opening (whitespace allowed inside the tags)."""

    OPENING: tuple[str, ...] = ()
    CLOSING: tuple[str, ...] = _PARAMETER_CLOSE
    KEEPS_EMPTY_KEY = False  # else a parameter with an empty key is read and dropped
    _loaded = False  # the value is JSON where it parses as such, else text (`_Arguments.start`)

    def _scan(self, text: str, *, final: bool) -> str:
        at = 0
        while at < len(text):
            if self._in_value:
                end, after = self._value_end(text, at, final=final)
                self._value(text[at : end if end >= 0 else len(text)])
                if end < 0:
                    return ""
                if after < 0:
                    return text[end:]
                self._close()
                at = after
                continue
            start = text.find("<", at)
            if start < 0:
                return ""
            status, end = _match(text, start, self.OPENING)
            key, after = "", 0
            if status is _Match.FULL:
                status, key, after = self._key(text, end, final=final)
            status = _decided(status, final=final)
            if status is _Match.PARTIAL:
                return text[start:]
            if status is _Match.NONE:
                at = start + 1
                continue
            self._start(key)
            at = after
        return ""

    def _value_end(self, text: str, at: int, *, final: bool) -> tuple[int, int]:
        """Where the value from `at` ends and where reading goes on (at the next opening, or after the closing tag);
        (index, -1) when what is there may still end it; (-1, -1) when nothing in `text` ends it."""
        start = text.find("<", at)
        while start >= 0:
            closing, after = _match(text, start, self.CLOSING)
            if closing is _Match.FULL:
                return start, after
            opening, _ = _match(text, start, self.OPENING)
            if opening is _Match.FULL:
                return start, start
            if not final and _Match.PARTIAL in (closing, opening):
                return start, -1
            start = text.find("<", start + 1)
        return -1, -1

    @abstractmethod
    def _key(self, text: str, at: int, *, final: bool) -> tuple[_Match, str, int]:
        """The rest of the opening tag from `at` (after OPENING): (FULL, its key, where the value starts), PARTIAL
        or NONE."""

    def _start(self, key: str) -> None:
        if key or self.KEEPS_EMPTY_KEY:
            self.arguments.start(key, loaded=self._loaded)
        self._in_value = True


class _Qwen3Parameters(_TaggedParameters):
    """`<parameter=KEY>VALUE</parameter>`: the key is the text up to ">" (whitespace before it aside), the value less
    one line break at each end."""

    OPENING = ("<", "", "parameter", "", "=")
    KEEPS_EMPTY_KEY = True

    def __init__(self, arguments: _Arguments) -> None:
        super().__init__(arguments)
        self._first = True  # no character of the value seen yet
        self._newline = False  # a line break at the value's end so far, held

    def _key(self, text: str, at: int, *, final: bool) -> tuple[_Match, str, int]:
        start = _skip_space(text, at)
        close = text.find(">", start)
        if close < 0:
            return _Match.PARTIAL, "", 0
        return _Match.FULL, text[start:close], close + 1

    def _start(self, key: str) -> None:
        super()._start(key)
        self._first, self._newline = True, False

    def _value(self, text: str) -> None:
        if self._first and text:
            self._first = False
            text = text.removeprefix("\n")
        if self._newline:
            text, self._newline = "\n" + text, False
        if text.endswith("\n"):
            text, self._newline = text[:-1], True
        super()._value(text)


class _MinimaxParameters(_TaggedParameters):
    """`<parameter name="KEY">VALUE</parameter>`: the key in double or single quotes, or bare (no whitespace or
    ">"), stripped; the value as written."""

    OPENING = ("<", "", "parameter", " ", "name", "", "=")

    def _key(self, text: str, at: int, *, final: bool) -> tuple[_Match, str, int]:
        start = _skip_space(text, at)
        for quote in ('"', "'"):
            if not text.startswith(quote, start):
                continue
            close = text.find(quote, start + 1)
            after = _skip_space(text, close + 1) if close >= 0 else len(text)
            if after == len(text) and not final:
                return _Match.PARTIAL, "", 0
            if after < len(text) and text[after] == ">":
                return _Match.FULL, text[start + 1 : close].strip(), after + 1
        end = start
        while end < len(text) and text[end] != ">" and not _is_space(text[end]):
            end += 1
        after = _skip_space(text, end)
        if after == len(text):
            return _Match.PARTIAL, "", 0
        if end == start or text[after] != ">":
            return _Match.NONE, "", 0
        return _Match.FULL, text[start:end].strip(), after + 1


_DSML = "｜DSML｜"


class _DsmlParameters(_TaggedParameters):
    """`<｜DSML｜parameter name="KEY" string="true|false">VALUE</｜DSML｜parameter>`: the key in double quotes, the
    `string` attribute optional; with "true" the value is text, else JSON where it parses as such (then text);
    either way its schema type converts it then."""

    OPENING = (f"<{_DSML}parameter", " ", "name=")
    CLOSING = (f"</{_DSML}parameter>",)

    def _key(self, text: str, at: int, *, final: bool) -> tuple[_Match, str, int]:
        status, end = _match(text, at, ('"',))
        close = text.find('"', end) if status is _Match.FULL else -1
        if status is _Match.FULL and close < 0:
            status = _Match.PARTIAL
        if status is not _Match.FULL:
            return status, "", 0
        key = text[end:close]
        attribute, after = _match(text, close + 1, (" ", 'string="'))
        value_end = text.find('"', after) if attribute is _Match.FULL else -1
        if attribute is _Match.FULL and value_end >= 0:
            tag_end, gt = _match(text, value_end + 1, ("", ">"))
            if tag_end is _Match.FULL:
                self._loaded = text[after:value_end] != "true"
                return _Match.FULL, key, gt
            attribute = tag_end
        elif attribute is _Match.FULL:
            attribute = _Match.PARTIAL
        if attribute is _Match.PARTIAL and not final:
            return _Match.PARTIAL, "", 0
        tag_end, gt = _match(text, close + 1, ("", ">"))
        self._loaded = True
        return tag_end, key, gt


class _GlmParameters(_ParameterReader):
    """`<arg_key>KEY</arg_key>`, whitespace, `<arg_value>VALUE</arg_value>`: the key (up to the first `</arg_key>`
    that such a value follows) stripped, the value as written."""

    KEY, KEY_END, VALUE, VALUE_END = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"

    def __init__(self, arguments: _Arguments) -> None:
        super().__init__(arguments)
        self._key: str | None = None  # the key so far, once `<arg_key>` came

    def _scan(self, text: str, *, final: bool) -> str:
        at = 0
        while at < len(text):
            marker = self.VALUE_END if self._in_value else self.KEY if self._key is None else self.KEY_END
            found = text.find(marker, at)
            if found < 0:
                held = len(text) - (0 if final else held_suffix_len(text[at:], (marker,)))
                self._read(text[at:held])
                return text[held:]
            if self._in_value:
                self._value(text[at:found])
                self._close()
                at = found + len(marker)
            elif self._key is None:
                self._key = ""
                at = found + len(marker)
            else:
                status, after = _match(text, found, (self.KEY_END, "", self.VALUE))
                status = _decided(status, final=final)
                if status is _Match.PARTIAL:
                    self._key += text[at:found]
                    return text[found:]
                if status is _Match.NONE:  # that `</arg_key>` is part of the key
                    self._key += text[at : found + 1]
                    at = found + 1
                    continue
                self.arguments.start((self._key + text[at:found]).strip())
                self._key, self._in_value = None, True
                at = after
        return ""

    def _read(self, text: str) -> None:
        if self._in_value:
            self._value(text)
        elif self._key is not None:
            self._key += text


class _State(Enum):
    CONTENT = 1
    PREAMBLE = 2  # inside a calls block, before a call's name: markup
    NAME = 3
    ARGUMENTS = 4
    BETWEEN = 5  # after a call, inside its block: markup


@dataclass(frozen=True, slots=True)
class _Step:
    to: _State
    starts: bool = False  # a call starts
    ends: bool = False  # the call ends
    into_arguments: bool = False  # the marker is the first text of the arguments


class XmlFamily:
    """A family's markers, what each does where (a marker not in `steps` is text there), how its arguments read."""

    def __init__(
        self,
        markers: tuple[str, ...],
        steps: Mapping[tuple[_State, str], _Step],
        reader: Callable[[_Arguments], _ParameterReader],
        *,
        checks_names: bool,  # a call must name one of the request's tools (when it has tools)
        keeps_content_space: bool = False,  # the content before the calls keeps its trailing whitespace
    ) -> None:
        self.markers, self.steps, self.reader, self.checks_names = markers, steps, reader, checks_names
        self.keeps_content_space = keeps_content_space
        # the earliest marker, and the longest of those that start there (a regex tries alternatives in order)
        self._pattern = re.compile("|".join(map(re.escape, sorted(markers, key=len, reverse=True))))
        self._longest = max(map(len, markers))

    def next_marker(self, text: str, at: int, *, final: bool) -> tuple[int, str]:
        """Where the next marker in text[at:] is, and which; while the text's end may still become a marker (also
        one that extends a complete marker), (where that end starts, ""). With `final`, the text ends: what may
        become a marker is what it is."""
        held = len(text)
        if not final:
            tail = max(at, held - self._longest)
            held -= held_suffix_len(text[tail:], self.markers)
        found = self._pattern.search(text, at)
        return (found.start(), found.group()) if found and found.start() < held else (held, "")


_C, _P, _N, _A, _B = _State.CONTENT, _State.PREAMBLE, _State.NAME, _State.ARGUMENTS, _State.BETWEEN
_THINK = ("<think>", "</think>")  # markers of vLLM's grammar that are text here: they only cut the text

QWEN3_CODER = XmlFamily(
    (*_THINK, "<tool_call>", "</tool_call>", "<function=", "</function>", "<parameter=", "</parameter>", ">"),
    {
        (_C, "<tool_call>"): _Step(_P, starts=True),
        (_C, "<function="): _Step(_N, starts=True),
        (_P, "</tool_call>"): _Step(_C, ends=True),
        (_P, "<function="): _Step(_N),
        (_N, ">"): _Step(_A),
        (_N, "</function>"): _Step(_B, ends=True),
        (_A, "</function>"): _Step(_B, ends=True),
        (_B, "</tool_call>"): _Step(_C),
        (_B, "<tool_call>"): _Step(_P, starts=True),
        (_B, "<function="): _Step(_N, starts=True),
    },
    _Qwen3Parameters,
    checks_names=False,
)
GLM47 = XmlFamily(
    (*_THINK, "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"),
    {
        (_C, "<tool_call>"): _Step(_N, starts=True),
        (_N, "<arg_key>"): _Step(_A, into_arguments=True),
        (_N, "</tool_call>"): _Step(_C, ends=True),
        (_A, "</tool_call>"): _Step(_C, ends=True),
    },
    _GlmParameters,
    checks_names=True,
)
_INVOKES = ('<invoke name="', "<invoke name='", "<invoke name=")
MINIMAX_M2 = XmlFamily(
    (*_THINK, "<minimax:tool_call>", "</minimax:tool_call>", "<parameter name=", "</parameter>", *_INVOKES,
     "</invoke>", '">', "'>", ">"),
    {
        (_C, "<minimax:tool_call>"): _Step(_P),
        **{(state, "</minimax:tool_call>"): _Step(_C) for state in (_C, _P, _B)},  # a stray one in content is dropped
        **{(state, invoke): _Step(_N, starts=True) for state in (_C, _P, _B) for invoke in _INVOKES},
        **{(_N, name_end): _Step(_A) for name_end in ('">', "'>", ">")},
        (_A, "</invoke>"): _Step(_B, ends=True),
    },
    _MinimaxParameters,
    checks_names=True,
)  # fmt: skip
_DSML_CALLS_BEGIN, _DSML_CALLS_END = f"<{_DSML}function_calls>", f"</{_DSML}function_calls>"
_DSML_INVOKE = f'<{_DSML}invoke name="'
DEEPSEEK_V32 = XmlFamily(
    (_DSML_CALLS_BEGIN, _DSML_CALLS_END, _DSML_INVOKE, '">', f"</{_DSML}invoke>", f"<{_DSML}parameter",
     f"</{_DSML}parameter>"),
    {
        (_C, _DSML_CALLS_BEGIN): _Step(_P),
        **{(state, _DSML_INVOKE): _Step(_N, starts=True) for state in (_C, _P, _B)},
        (_N, '">'): _Step(_A),
        (_A, f"</{_DSML}invoke>"): _Step(_B, ends=True),
        (_A, _DSML_CALLS_END): _Step(_B, ends=True),
        (_B, _DSML_CALLS_END): _Step(_B),
        (_B, _DSML_CALLS_BEGIN): _Step(_P),
    },
    _DsmlParameters,
    checks_names=False,
    keeps_content_space=True,
)  # fmt: skip


class XmlCalls(TextStage):
    """One request's calls of an XML-parameter family; `tools`: its tools' names and parameter types."""

    def __init__(self, family: XmlFamily, tools: ToolTypes) -> None:
        self._family = family
        self._tools = tools
        self._state = _State.CONTENT
        self._held = ""  # text that may still become a marker
        self._name = ""  # the name of the call being read, so far
        self._open = False  # a call started and has not ended
        self._reader: _ParameterReader | None = None  # the arguments of the open call, when it stands
        self._calls = 0  # calls that stand
        self._started = False  # a call has started (then whitespace alone is no content)
        self._space = ""  # whitespace at the end of the content, held
        self._wrote = False  # the content has text other than whitespace

    def feed(self, text: str, out: ParsedOutput) -> None:
        self._run(self._held + text, out, final=False)

    def finish(self, out: ParsedOutput) -> None:
        self._run(self._held, out, final=True)
        if self._state is _State.NAME:
            self._named(out)
        self._end_call(out)
        if not self._calls and (self._wrote or not self._started):
            out.content += self._space
        self._space = ""

    def _run(self, text: str, out: ParsedOutput, *, final: bool) -> None:
        self._held = ""
        at = 0
        while at < len(text):
            found, marker = self._family.next_marker(text, at, final=final)
            if found > at:
                self._text(text[at:found], out)
            if not marker:
                self._held = text[found:]
                return
            at = found + len(marker)
            step = self._family.steps.get((self._state, marker))
            if step is None:
                self._text(marker, out)
                continue
            if self._state is _State.NAME and step.to is not _State.NAME:
                self._named(out)
            if step.ends:
                self._end_call(out)
            if step.starts:
                self._open, self._started, self._name = True, True, ""
            self._state = step.to
            if step.into_arguments:
                self._text(marker, out)

    def _text(self, text: str, out: ParsedOutput) -> None:
        if self._state is _State.CONTENT:
            self._content(text, out)
        elif self._state is _State.NAME:
            self._name += text
        elif self._state is _State.ARGUMENTS and self._reader is not None:
            self._reader.feed(text)
            arguments = self._reader.arguments.take()
            if arguments:
                out.add_tool(self._calls, arguments=arguments)

    def _content(self, text: str, out: ParsedOutput) -> None:
        if self._calls:
            return  # once a call stands, the content is the text before the first call
        kept, self._space = trailing_space(self._space, text)
        if kept:
            out.content += kept
            self._wrote = True

    def _named(self, out: ParsedOutput) -> None:
        """The call's name is complete: the call stands if it has one the request allows."""
        name, self._name = self._name.strip(), ""
        if not (self._open and name) or (self._family.checks_names and not self._tools.knows(name)):
            return
        if self._family.keeps_content_space and self._wrote and not self._calls:
            out.content += self._space
        self._space = ""  # the content ends before the calls (without its trailing whitespace, as most families)
        self._reader = self._family.reader(_Arguments(self._tools.of(name)))
        out.add_tool(self._calls, name=name, arguments="{")

    def _end_call(self, out: ParsedOutput) -> None:
        if not self._open:
            return
        self._open = False
        if self._reader is not None:
            self._reader.end()
            out.add_tool(self._calls, arguments=self._reader.arguments.take() + "}")
            self._calls += 1
            self._reader = None
