"""vLLM's /tokenize and /detokenize: request and response shapes, and the work (run off the event loop).

/tokenize takes either a completion-style body (`prompt`, add_special_tokens default true) or a chat-style one
(`messages`, rendered with the chat template exactly as /v1/chat/completions renders them, add_special_tokens
default false); `return_token_strs` adds each id's token string. /detokenize decodes `tokens` with the special
tokens kept (vLLM's behaviour).
"""

from __future__ import annotations

from typing import Any

import msgspec

from detok_worker.front.errors import bad_request
from detok_worker.front.openai_api import ChatCompletionRequest
from detok_worker.front.prompts import chat_prompt_ids, encode_text
from detok_worker.front.validation import Limits, check_prompt_chars, check_token_ids, decode_json
from detok_worker.tokenizer.protocol import Tokenizer, TokenizerError


class TokenizeCompletionRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    prompt: str
    model: str | None = None
    add_special_tokens: bool | None = None  # null = true
    return_token_strs: bool | None = None


class TokenizeChatRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    messages: list[dict[str, Any]]
    model: str | None = None
    add_generation_prompt: bool | None = None  # null = true
    continue_final_message: bool | None = None
    add_special_tokens: bool | None = None  # null = false (the template writes them)
    return_token_strs: bool | None = None
    tools: list[dict[str, Any]] | None = None
    documents: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: str | None = None


class TokenizeResponse(msgspec.Struct):
    count: int
    max_model_len: int | None
    tokens: list[int]
    token_strs: list[str | None] | None = None


class DetokenizeRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    tokens: list[int]
    model: str | None = None


class DetokenizeResponse(msgspec.Struct):
    prompt: str


_detokenize_decoder = msgspec.json.Decoder(DetokenizeRequest)


def decode_tokenize(body: bytes) -> TokenizeCompletionRequest | TokenizeChatRequest:
    """vLLM's union: a body with `messages` is the chat form, any other the completion form."""
    raw = decode_json(msgspec.json.Decoder(), body)
    kind = TokenizeChatRequest if isinstance(raw, dict) and "messages" in raw else TokenizeCompletionRequest
    return decode_json(msgspec.json.Decoder(kind), body)


def decode_detokenize(body: bytes) -> DetokenizeRequest:
    return decode_json(_detokenize_decoder, body)


def tokenize(
    request: TokenizeCompletionRequest | TokenizeChatRequest,
    tokenizer: Tokenizer,
    limits: Limits,
    max_model_len: int | None,
) -> TokenizeResponse:
    if isinstance(request, TokenizeChatRequest):
        fields = msgspec.structs.asdict(request)  # a chat request's fields, by the same names
        del fields["return_token_strs"]
        ids = chat_prompt_ids(ChatCompletionRequest(**fields), tokenizer, limits)
    else:
        check_prompt_chars(len(request.prompt), limits, "prompt")
        ids = encode_text(tokenizer, request.prompt, request.add_special_tokens is not False, "prompt")
    strs = [tokenizer.id_to_token(i) for i in ids] if request.return_token_strs else None
    return TokenizeResponse(len(ids), max_model_len, ids, strs)


def detokenize(request: DetokenizeRequest, tokenizer: Tokenizer, limits: Limits) -> DetokenizeResponse:
    check_token_ids(request.tokens, limits, "tokens")
    try:
        return DetokenizeResponse(tokenizer.decode(request.tokens, skip_special_tokens=False))
    except (TokenizerError, ValueError) as exc:
        raise bad_request(f"the tokens cannot be decoded: {exc}", "tokens") from exc
