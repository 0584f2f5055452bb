"""The grammar vLLM's server puts on a chat request with tools, built by vLLM's own parser classes: the parser of
`--tool-call-parser` (with `--reasoning-parser`) adjusts a request carrying the client's tools, tool_choice and
parallel_tool_calls, and its structured outputs are the request's (the tool-call parser's structural tag for
tool_choice "required" or a named function, and for "auto" when a tool is strict or parallel_tool_calls is false;
none otherwise). The front sends those fields as a CONSTRAINT_TOOL_CALLS constraint (front.tool_choice_grammar =
"tool_parser", which `detok serve --source vllm` sets where vLLM's parser has such a grammar). Imported only by the
vLLM source.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from vllm.config import ModelConfig
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.parser.abstract_parser import Parser
from vllm.parser.parser_manager import ParserManager
from vllm.sampling_params import StructuredOutputsParams
from vllm.tokenizers import TokenizerLike

# the chat request fields the grammar depends on
FIELDS = ("tools", "tool_choice", "parallel_tool_calls")


class ToolGrammar:
    def __init__(self, parser_cls: type[Parser], tokenizer: TokenizerLike, model_config: ModelConfig) -> None:
        self.parser_cls = parser_cls
        self.tokenizer = tokenizer
        self.model_config = model_config

    @classmethod
    def from_args(
        cls, args: argparse.Namespace, model_config: ModelConfig, tokenizer: TokenizerLike | None
    ) -> ToolGrammar | None:
        """The grammar of `vllm serve`'s flags; None without tool parsing (`--enable-auto-tool-choice` and
        `--tool-call-parser`) or without vLLM's tokenizer (its parsers read the markers' ids from it)."""
        if not (args.enable_auto_tool_choice and args.tool_call_parser) or tokenizer is None:
            return None
        parser_cls = ParserManager.get_parser(
            tool_parser_name=args.tool_call_parser,
            reasoning_parser_name=args.reasoning_parser or None,
            enable_auto_tools=True,
            model_name=model_config.model,
            is_harmony=model_config.hf_config.model_type == "gpt_oss",
            tool_strict_level=getattr(args, "tool_strict_level", "auto"),
            tokenizer=tokenizer,
        )
        return None if parser_cls is None else cls(parser_cls, tokenizer, model_config)

    def structured_outputs(self, spec: str) -> StructuredOutputsParams | None:
        """`spec`: the CONSTRAINT_TOOL_CALLS fields as JSON text. Raises ValueError (pydantic's, vLLM's) for fields
        vLLM's request refuses, and for any other failure of vLLM's parser on them: the client's tools end only
        their own request."""
        try:
            fields: dict[str, Any] = {name: value for name, value in json.loads(spec).items() if value is not None}
            request = ChatCompletionRequest(messages=[], **{name: fields[name] for name in FIELDS if name in fields})
            parser = self.parser_cls(
                self.tokenizer, request.tools, model_config=self.model_config, chat_template_kwargs={}
            )
            return parser.adjust_request(request).structured_outputs
        except ValueError:
            raise
        except Exception as exc:  # noqa: BLE001 - vLLM's parser code on the client's tools
            raise ValueError(f"vLLM's tool-call parser could not build the tools' grammar: {exc!r}") from exc
