"""Tokenizers that exist only as Python objects: a user's `module:Class`, or the tokenizer an engine builds
(SGLang's or vLLM's `get_tokenizer`, when installed).

A custom class implements `CustomTokenizer` (below) and is named as `"package.module:ClassName"`; it is built
with `ClassName(**options)`. The easiest way is to subclass `PythonTokenizer`, which is the protocol's base class:
implement `encode` and `decode` (and, where you can, `token_to_id`, `id_to_token` and `token_bytes_table`); pass the
vocabulary size and special tokens to `__init__`. Any other object with `encode`/`decode` and a vocabulary size
is wrapped by `CustomTokenizerAdapter`; objects with the transformers tokenizer API (what SGLang and vLLM return)
by `TransformersTokenizerAdapter`, which keeps their own chat template.

Offsets: taken from the object's `Encoding` when it returns one; otherwise computed from `token_bytes` when the
object has it; otherwise computed by decoding growing prefixes (exact but slow: give token_bytes if you can).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from detok_worker.tokenizer.base import TokenizerBase, char_spans_from_byte_lengths
from detok_worker.tokenizer.chat.source import load_chat_template
from detok_worker.tokenizer.loading.side_files import build_special_tokens
from detok_worker.tokenizer.protocol import (
    SPECIAL_TOKEN_ROLES,
    Encoding,
    SpecialTokens,
    Tokenizer,
    TokenizerLoadError,
)
from detok_worker.tokenizer.token_bytes import TokenBytesTable


@runtime_checkable
class CustomTokenizer(Protocol):
    """The minimum a Python tokenizer class provides. Optional extras the adapter uses when present:
    `encode_batch(texts, add_special_tokens)`, `token_to_id(str)`, `id_to_token(int)`, `token_bytes(int) -> bytes`
    (exact offsets, and the streaming fast path when decode is the concatenation of these bytes) or
    `token_bytes_table() -> TokenBytesTable`, `special_tokens` (SpecialTokens or a role -> text dict),
    `special_token_ids`, `eos_token_ids`, `chat_template` (a template string)."""

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str, add_special_tokens: bool = False) -> Encoding | list[int]: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str: ...


class PythonTokenizer(TokenizerBase):
    """Base class for custom tokenizers: subclass, call `super().__init__(name=..., vocab_size=...,
    special_tokens=..., special_token_ids=..., eos_token_ids=...)`, implement encode/decode/token_to_id/id_to_token.
    `chat_template` may be a template string or a .jinja/.json path."""

    def __init__(self, *, chat_template: str | None = None, **fields: Any) -> None:
        super().__init__(chat_templates=load_chat_template(None, chat_template) if chat_template else None, **fields)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Every subclass's decode validates ids first, so a bad id is always an InvalidTokenIdError."""
        super().__init_subclass__(**kwargs)
        decode = cls.__dict__.get("decode")
        if decode is not None and not getattr(decode, "_checks_ids", False):

            @functools.wraps(decode)
            def checked_decode(self: PythonTokenizer, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
                self.check_ids(ids)
                return decode(self, ids, skip_special_tokens)

            checked_decode._checks_ids = True  # type: ignore[attr-defined]
            cls.decode = checked_decode  # type: ignore[method-assign]

    def token_to_id(self, token: str) -> int | None:
        return None

    def id_to_token(self, token_id: int) -> str | None:
        return None


def prefix_decode_offsets(decode: Any, ids: Sequence[int], text: str) -> list[tuple[int, int]]:
    """Character spans from decoding growing prefixes; a token whose prefix decode does not extend the text
    cleanly (a partial character) gets the span of the characters it completes."""
    spans = []
    done = 0
    pending = 0
    for count in range(1, len(ids) + 1):
        prefix = decode(ids[:count]).rstrip("\ufffd")
        end = len(prefix) if text.startswith(prefix) else done
        end = max(end, done)
        pending += 1
        if end > done or count == len(ids):
            spans += [(done, end)] * pending
            done, pending = end, 0
    return spans


class CustomTokenizerAdapter(TokenizerBase):
    """Any CustomTokenizer object behind the full protocol."""

    def __init__(self, inner: Any, *, name: str) -> None:
        self._inner = inner
        special = getattr(inner, "special_tokens", None)
        if isinstance(special, Mapping):
            special = build_special_tokens(dict(special), set(special.values()))
        template = getattr(inner, "chat_template", None)
        super().__init__(
            name=name,
            vocab_size=int(inner.vocab_size),
            special_tokens=special if isinstance(special, SpecialTokens) else SpecialTokens(),
            special_token_ids=getattr(inner, "special_token_ids", ()) or (),
            eos_token_ids=getattr(inner, "eos_token_ids", ()) or (),
            chat_templates=load_chat_template(None, template) if isinstance(template, str) and template else None,
        )

    def token_bytes_table(self) -> TokenBytesTable | None:
        """The wrapped object's table (for the streaming fast path), or one built from its token_bytes."""
        if hasattr(self._inner, "token_bytes_table"):
            return self._inner.token_bytes_table()
        token_bytes = getattr(self._inner, "token_bytes", None)
        return TokenBytesTable(pieces=[token_bytes(i) for i in range(self.vocab_size)]) if token_bytes else None

    def encode(self, text: str, add_special_tokens: bool = False) -> Encoding:
        result = self._inner.encode(text, add_special_tokens)
        if isinstance(result, Encoding) and len(result.offsets) == len(result.ids):
            return result
        ids = list(result.ids if isinstance(result, Encoding) else result)
        token_bytes = getattr(self._inner, "token_bytes", None)
        lengths = [len(token_bytes(i)) for i in ids] if token_bytes is not None else None
        if lengths is not None and sum(lengths) == len(text.encode()):
            return Encoding(ids=ids, offsets=char_spans_from_byte_lengths(text, lengths))
        return Encoding(ids=ids, offsets=prefix_decode_offsets(self.decode, ids, text))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        self.check_ids(ids)
        return self._inner.decode(list(ids), skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        method = getattr(self._inner, "token_to_id", None)
        return method(token) if method else None

    def id_to_token(self, token_id: int) -> str | None:
        method = getattr(self._inner, "id_to_token", None)
        return method(token_id) if method else None


class TransformersTokenizerAdapter(TokenizerBase):
    """A transformers-style tokenizer object (AutoTokenizer, or what SGLang/vLLM `get_tokenizer` return)."""

    def __init__(self, inner: Any, *, name: str) -> None:
        self._inner = inner
        named = {
            role: value
            for role in SPECIAL_TOKEN_ROLES
            if isinstance(value := getattr(inner, f"{role}_token", None), str)
        }
        special_texts = set(inner.all_special_tokens)
        eos = inner.eos_token_id
        super().__init__(
            name=name,
            vocab_size=len(inner),
            special_tokens=build_special_tokens(named, special_texts),
            special_token_ids=inner.all_special_ids,
            eos_token_ids=[eos] if isinstance(eos, int) else [],
        )

    def encode(self, text: str, add_special_tokens: bool = False) -> Encoding:
        if getattr(self._inner, "is_fast", False):
            result = self._inner(text, add_special_tokens=add_special_tokens, return_offsets_mapping=True)
            return Encoding(ids=list(result["input_ids"]), offsets=[tuple(o) for o in result["offset_mapping"]])
        ids = self._inner.encode(text, add_special_tokens=add_special_tokens)
        return Encoding(ids=ids, offsets=prefix_decode_offsets(self.decode, ids, text))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        self.check_ids(ids)
        return self._inner.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        token_id = self._inner.convert_tokens_to_ids(token)
        return token_id if isinstance(token_id, int) and self._inner.convert_ids_to_tokens(token_id) == token else None

    def id_to_token(self, token_id: int) -> str | None:
        return self._inner.convert_ids_to_tokens(token_id) if 0 <= token_id < self.vocab_size else None

    def token_bytes_table(self) -> TokenBytesTable | None:
        """From the fast tokenizer's `tokenizers` object (the streaming core verifies it against decode)."""
        backend = getattr(self._inner, "backend_tokenizer", None)
        if backend is None:
            return None
        from detok_worker.tokenizer.backends.hf_token_bytes import hf_token_bytes_table

        return hf_token_bytes_table(backend, self.vocab_size)

    def apply_chat_template(self, messages: list[dict[str, Any]], **kwargs: Any) -> str:
        """The wrapped tokenizer's own template (what the engine itself would render)."""
        return self._inner.apply_chat_template(messages, tokenize=False, **kwargs)


def wrap_python_tokenizer(obj: Any, *, name: str) -> Tokenizer:
    """The protocol view of a Python tokenizer object (returned unchanged when it already is one)."""
    if isinstance(obj, Tokenizer):
        return obj
    if hasattr(obj, "convert_ids_to_tokens") and hasattr(obj, "all_special_ids"):
        return TransformersTokenizerAdapter(obj, name=name)
    if isinstance(obj, CustomTokenizer):
        return CustomTokenizerAdapter(obj, name=name)
    raise TokenizerLoadError(
        f"{name}: {type(obj).__name__} does not implement the tokenizer protocol "
        "(needs encode(text, add_special_tokens), decode(ids, skip_special_tokens) and vocab_size)"
    )


def load_python_class(spec: str, options: Mapping[str, Any] | None = None) -> Tokenizer:
    """Build `module:Class` with `Class(**options)` and wrap it."""
    module_name, _, class_name = spec.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
        for part in class_name.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        raise TokenizerLoadError(f"cannot import tokenizer class {spec!r}: {exc}") from exc
    try:
        instance = target(**dict(options or {}))
    except Exception as exc:  # a user's constructor may raise anything
        raise TokenizerLoadError(f"tokenizer class {spec!r} failed to initialise: {exc}") from exc
    return wrap_python_tokenizer(instance, name=spec)


# Engine name -> (module, function) candidates for its get_tokenizer, newest layout first.
ENGINE_GET_TOKENIZER: dict[str, tuple[tuple[str, str], ...]] = {
    "sglang": (
        ("sglang.srt.utils.hf_transformers_utils", "get_tokenizer"),
        ("sglang.srt.hf_transformers_utils", "get_tokenizer"),
    ),
    "vllm": (("vllm.tokenizers", "get_tokenizer"), ("vllm.transformers_utils.tokenizer", "get_tokenizer")),
}


def load_engine_tokenizer(engine: str, model: str, **kwargs: Any) -> Tokenizer:
    """The tokenizer SGLang or vLLM would build for `model` (only when that engine is installed)."""
    candidates = ENGINE_GET_TOKENIZER.get(engine)
    if candidates is None:
        raise TokenizerLoadError(f"unknown engine {engine!r}; known: {', '.join(ENGINE_GET_TOKENIZER)}")
    for module_name, function in candidates:
        try:
            get_tokenizer = getattr(importlib.import_module(module_name), function)
        except (ImportError, AttributeError):
            continue
        try:
            return wrap_python_tokenizer(get_tokenizer(model, **kwargs), name=f"{engine}:{model}")
        except TokenizerLoadError:
            raise
        except Exception as exc:  # the engine's loader may raise anything
            raise TokenizerLoadError(f"{engine} could not load the tokenizer of {model!r}: {exc}") from exc
    raise TokenizerLoadError(
        f"backend {engine!r} needs {engine} installed (tried {', '.join(m for m, _ in candidates)})"
    )
