"""One request's parsers on the worker: raw decoded text in, a ParsedDelta (per-channel text with per-channel
offsets) out, and the stop strings, which with a parser apply to the content only (a stop string the model writes
while reasoning does not end the request; hosted APIs and vLLM's PR #14550 behave so).

Offsets count what this rid emitted per channel. The parsers split the text the same way however it is cut into
pieces (parse/base.py), so a worker that re-opens the rid and decodes the whole history at once emits the same
channels, and the front drops what it already has per channel (bus/reassembly.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from detok_worker.bus.messages import ParsedDelta, ToolCallDelta
from detok_worker.parse.base import OutputParser, ParsedOutput
from detok_worker.parse.reasoning import ReasoningTokenCount
from detok_worker.parse.registry import create_parser, reasoning_token_count
from detok_worker.stream.decode import decode_text
from detok_worker.stream.stop.matcher import StopStringFilter, StopStringMatch, compile_stop_strings
from detok_worker.stream.stop.rules import StopRules
from detok_worker.tokenizer.protocol import Tokenizer


@dataclass(slots=True)
class RidParsing:
    parser: OutputParser
    stop_filter: StopStringFilter | None  # the request's stop strings, over the content
    content_offset: int = 0
    reasoning_offset: int = 0
    arguments_offsets: dict[int, int] = field(default_factory=dict)  # tool call index -> arguments emitted
    reasoning_tokens: ReasoningTokenCount | None = None  # vLLM's count of the reasoning tokens, where it has one
    failed: bool = False  # the parser raised: its state is unknown, nothing more goes through it

    def count(self, ids: list[int]) -> None:
        """The request's next output ids (those its decoder consumed), for the count of its reasoning tokens."""
        if self.reasoning_tokens is not None:
            self.reasoning_tokens.add(ids)

    def take(self, text: str, *, final: bool) -> tuple[ParsedDelta, StopStringMatch | None]:
        """Parse the next raw text (and flush at the end); returns the delta and a stop string found in content.
        Once `failed`, an empty delta at the channels' offsets (the rid's last, with its error)."""
        if self.failed:
            text, final = "", False
        out = self.parser.feed(text) if text else ParsedOutput()
        if final:
            out.extend(self.parser.finish())
        match = None
        content = out.content
        if self.stop_filter is not None:
            content, match = self.stop_filter.feed_one(content)
            if match is None and final:
                content += self.stop_filter.release()
        counted = self.reasoning_tokens.count if self.reasoning_tokens is not None else 0
        delta = ParsedDelta(
            content, self.content_offset, out.reasoning, self.reasoning_offset, self._calls(out), counted
        )
        self.content_offset += len(content)
        self.reasoning_offset += len(out.reasoning)
        return delta, match

    def _calls(self, out: ParsedOutput) -> list[ToolCallDelta]:
        calls = []
        for piece in out.tool_calls:
            offset = self.arguments_offsets.get(piece.index, 0)
            calls.append(ToolCallDelta(piece.index, piece.name, piece.arguments, offset, piece.id))
            self.arguments_offsets[piece.index] = offset + len(piece.arguments)
        return calls


def parsing_for(rules: StopRules, tokenizer: Tokenizer, prompt_tail: list[int]) -> RidParsing | None:
    """The parsing state of a request whose params name parsers (None if they name none); its stop strings, hidden
    or visible as its decoder's would be (StopRules.decoder_config), apply to the content. Raises ParserError."""
    params = rules.params
    if not (params.reasoning_parser or params.tool_call_parser):
        return None
    tail_text = decode_text(tokenizer, prompt_tail) if prompt_tail else ""
    parser = create_parser(
        params.reasoning_parser, params.tool_call_parser, tail_text, params.tool_function, params.tool_parameter_types
    )
    if parser is None:
        return None
    stop_filter = None
    if params.stop:
        config = rules.decoder_config()
        stop_filter = StopStringFilter(compile_stop_strings(config.stop_sequences, config.visible_stop_sequences))
    counter = reasoning_token_count(params.reasoning_parser, tokenizer.token_to_id)
    return RidParsing(parser, stop_filter, reasoning_tokens=counter)
