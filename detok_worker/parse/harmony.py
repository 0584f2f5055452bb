"""gpt-oss harmony messages: `<|channel|>analysis<|message|>...<|end|><|start|>assistant<|channel|>final<|message|>...`

The worker decodes harmony requests with special tokens kept (the front asks for it), so the markers are in the
text. Each message is a header (up to `<|message|>`: channel, and a recipient `to=functions.NAME` for a tool call)
and a body (up to `<|end|>`, `<|call|>`, `<|return|>` or the next `<|start|>`). Bodies go to: `analysis` ->
reasoning; a `functions.*` recipient -> a tool call whose arguments are the body; `final` and `commentary` ->
content. A header is held whole (it is short); a body streams, holding back only what may start a marker.
"""

from __future__ import annotations

import re

from detok_worker.parse.base import ParsedOutput, TextStage

MESSAGE = "<|message|>"
CHANNEL = "<|channel|>"
BODY_ENDS = ("<|end|>", "<|call|>", "<|return|>", "<|start|>", CHANNEL)
_CHANNEL_NAME = re.compile(r"<\|channel\|>\s*([A-Za-z_]+)")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
TOOL_PREFIX = "functions."


class HarmonyStage(TextStage):
    def __init__(self, *, reasoning: bool = True, tools: bool = True) -> None:
        self.reasoning = reasoning
        self.tools = tools
        self._in_body = False  # else `_held` is the header so far
        self._route = "content"  # where the current body goes: "content", "reasoning" or "tool"
        self._calls = 0

    def _step(self, buffer: str, out: ParsedOutput) -> str:
        if not self._in_body:
            at = buffer.find(MESSAGE)
            if at < 0:
                self._held = buffer
                return ""
            self._open_body(buffer[:at], out)
            return buffer[at + len(MESSAGE) :]
        body, marker, rest = self._cut(buffer, BODY_ENDS)
        self._emit(body, out)
        if marker:
            self._in_body = False
            if self._route == "tool":
                self._calls += 1
        return marker + rest if marker in ("<|start|>", CHANNEL) else rest

    def _open_body(self, header: str, out: ParsedOutput) -> None:
        channel = _CHANNEL_NAME.search(header)
        recipient = _RECIPIENT.search(header)
        self._in_body = True
        if recipient is not None and recipient.group(1).startswith(TOOL_PREFIX) and self.tools:
            self._route = "tool"
            out.add_tool(self._calls, name=recipient.group(1)[len(TOOL_PREFIX) :])
        elif channel is not None and channel.group(1) == "analysis" and self.reasoning:
            self._route = "reasoning"
        else:
            self._route = "content"

    def _emit(self, text: str, out: ParsedOutput) -> None:
        if not text:
            return
        if self._route == "tool":
            out.add_tool(self._calls, arguments=text)
        elif self._route == "reasoning":
            out.reasoning += text
        else:
            out.content += text

    def finish(self, out: ParsedOutput) -> None:
        held, self._held = self._held, ""
        if self._in_body:
            self._emit(held, out)
        elif "<|" not in held:
            out.content += held  # not harmony at all: plain text
