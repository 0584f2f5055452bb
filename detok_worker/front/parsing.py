"""Which parsers a chat request gets (the worker runs them: worker/parsing.py).

`front.reasoning_parser` / `front.tool_call_parser` name them ("auto": by the tokenizer's family, "" or "none":
off). Like vLLM: parsers apply to chat completions only; the tool-call parser only when the request has `tools`
and `tool_choice` is not "none"; parsers whose markers are special tokens turn `skip_special_tokens` off.

A `tool_choice` of "required" or a named function constrains the output to call JSON (front/sampling.py); where the
front parses tool calls (front.tool_call_parser is not "none": on `--source vllm`, vLLM's
`--enable-auto-tool-choice`), that output is turned into tool calls, as vLLM's server does: the worker runs the
stage for it in place of the family's parser. With front.tool_choice_grammar = "tool_parser" the engine constrains
the output to the family's own call format instead, and the family's parser reads it (vLLM's structural tags).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from detok_worker.bus.messages import RequestParams
from detok_worker.config import DetokConfig
from detok_worker.config.schema import ConfigError
from detok_worker.front.errors import bad_request
from detok_worker.front.openai_api import ChatCompletionRequest
from detok_worker.front.prompts import merged_template_kwargs
from detok_worker.parse.registry import (
    HARMONY,
    NAMED_CALL,
    NEEDS_SPECIAL_TOKENS,
    REQUIRED_CALLS,
    SCHEMA_TOOL_CALL_PARSERS,
    THINKING_SWITCHED,
    ParserError,
    check_names,
    resolve,
)
from detok_worker.parse.tool_types import parameter_types
from detok_worker.tokenizer.protocol import Tokenizer


@dataclass(frozen=True, slots=True)
class ParserChoice:
    reasoning: str  # "" = none
    tool_calls: str
    forced_calls: bool = True  # a tool_choice that forces calls gives tool calls (else their JSON is content)
    parser_reads_forced: bool = False  # front.tool_choice_grammar = "tool_parser": forced calls in the family's format
    tools_need_parser: bool = False  # front.tools_need_parser: a request with tools and no parser is refused
    # front.chat_template_kwargs: where a request's `enable_thinking` comes from when it gives none
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_config(cls, config: DetokConfig, tokenizer: Tokenizer) -> ParserChoice:
        reasoning = resolve(config.front.reasoning_parser, tokenizer.token_to_id, tools=False)
        tool_calls = resolve(config.front.tool_call_parser, tokenizer.token_to_id, tools=True)
        try:
            check_names(reasoning, tool_calls)
        except ParserError as exc:
            raise ConfigError(f"front.reasoning_parser / front.tool_call_parser: {exc}") from exc
        return cls(
            reasoning,
            tool_calls,
            forced_calls=config.front.tool_call_parser not in ("", "none"),
            parser_reads_forced=config.front.tool_choice_grammar == "tool_parser",
            tools_need_parser=config.front.tools_need_parser,
            template_kwargs=dict(config.front.chat_template_kwargs),
        )

    def forced_shape(self, body: ChatCompletionRequest) -> str:
        """How the answer to a tool_choice that forces calls we turn into tool calls is shaped: REQUIRED_CALLS or
        NAMED_CALL (front/responses.py); "" for none."""
        choice = body.tool_choice
        if not (self.forced_calls and body.tools and self.tool_calls != HARMONY):
            return ""
        if choice == "required":
            return REQUIRED_CALLS
        return NAMED_CALL if isinstance(choice, dict) else ""

    def for_chat(self, body: ChatCompletionRequest, params: RequestParams) -> RequestParams:
        """The request's params with its parsers named; a request with tools that no parser reads is refused where
        front.tools_need_parser says so, with vLLM's server's words (tools without a tool_choice mean "auto")."""
        if self.tools_need_parser and not self.tool_calls and body.tools and body.tool_choice != "none":
            choice = body.tool_choice if body.tool_choice is not None else "auto"
            if choice == "auto":
                message = '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
            else:
                named = isinstance(choice, dict) and (choice.get("function") or {}).get("name")
                described = f'function "{named}"' if named else f'"{choice}"'
                message = f"tool_choice={described} requires --tool-call-parser to be set"
            raise bad_request(message, "tool_choice")
        forced = "" if self.parser_reads_forced else self.forced_shape(body)
        reasoning = self.reasoning
        # the chat's template arguments (the request's over the server's) may turn thinking off
        switch = THINKING_SWITCHED.get(reasoning)
        if switch is not None and not switch(merged_template_kwargs(body, self.template_kwargs)):
            reasoning = ""
        function = str((body.tool_choice.get("function") or {}).get("name") or "") if forced == NAMED_CALL else ""
        tool_calls = forced or (self.tool_calls if body.tools and body.tool_choice != "none" else "")
        if not (reasoning or tool_calls):
            return params
        types = parameter_types(body.tools) if tool_calls in SCHEMA_TOOL_CALL_PARSERS else ""
        detok = msgspec.structs.replace(
            params.detok,
            reasoning_parser=reasoning,
            tool_call_parser=tool_calls,
            tool_function=function,
            tool_parameter_types=types,
        )
        if {reasoning, tool_calls} & NEEDS_SPECIAL_TOKENS:
            detok = msgspec.structs.replace(detok, skip_special_tokens=False)
        return msgspec.structs.replace(params, detok=detok)
