"""The tokenizer protocol every backend implements and everything else depends on.

Kept small and stable: the streaming core needs only decode, the vocabulary and the special-token set; the
front needs encode and chat templates. Backends live one per module beside this file.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from detok_worker.errors import OperatorError

if TYPE_CHECKING:
    from detok_worker.tokenizer.token_bytes import TokenBytesTable


class TokenizerError(OperatorError):
    """Base class of every error the tokenizer layer raises on purpose."""


class TokenizerLoadError(TokenizerError):
    """A tokenizer could not be found or loaded; the message says what was tried and what is supported."""


class InvalidTokenIdError(TokenizerError, ValueError):
    """A value that is not a token id of the tokenizer: not an int (bool, float, str, None...), outside
    [0, vocab_size), or an id the vocabulary skips. `of`: whose ids [0, vocab_size) are (a model's vocabulary may be
    larger than its tokenizer's)."""

    def __init__(self, token_id: object, vocab_size: int, of: str = "this tokenizer") -> None:
        if is_int_id(token_id):
            inside = 0 <= token_id < vocab_size  # type: ignore[operator]
            reason = f"token id {token_id} " + ("names no token" if inside else f"is out of range for {of}")
        else:
            reason = f"token id {token_id!r} is a {type(token_id).__name__}, not an int"
        super().__init__(f"{reason} (valid ids: ints 0..{vocab_size - 1})")
        self.token_id = token_id
        self.vocab_size = vocab_size


def is_int_id(value: object) -> bool:
    """An int that may be a token id (bool is an int subclass, but True is not id 1)."""
    return type(value) is int or (isinstance(value, int) and not isinstance(value, bool))


def is_count(value: object) -> bool:
    """An int >= 0 that is not a bool: a token id before its tokenizer's range is known, a count, a size."""
    return is_int_id(value) and value >= 0  # type: ignore[operator]


def check_token_ids(ids: Sequence[object], vocab_size: int, unknown: AbstractSet[int] = frozenset()) -> None:
    """The one validation of ids at every boundary (decode, streams, stop decoders): raise InvalidTokenIdError
    naming the first entry that is not an int in [0, vocab_size) outside `unknown` (ids naming no token)."""
    if not ids:
        return
    all_ints = set(map(type, ids)) == {int}
    if all_ints and min(ids) >= 0 and max(ids) < vocab_size and (not unknown or unknown.isdisjoint(ids)):  # type: ignore
        return
    for token_id in ids:
        if not is_int_id(token_id) or not 0 <= token_id < vocab_size or token_id in unknown:  # type: ignore[operator]
            raise InvalidTokenIdError(token_id, vocab_size)


@dataclass(frozen=True, slots=True)
class Encoding:
    """Result of encode: ids and, per token, the (start, end) character span of the input it came from."""

    ids: list[int]
    offsets: list[tuple[int, int]] = field(default_factory=list)

    def hash(self) -> str:
        """A stable hash of the ids (hex sha256 of their little-endian uint32 bytes)."""
        return hashlib.sha256(b"".join(i.to_bytes(4, "little") for i in self.ids)).hexdigest()

    def __len__(self) -> int:
        return len(self.ids)


@dataclass(frozen=True, slots=True)
class SpecialTokens:
    """Named special tokens (None where the tokenizer has none) plus every other special token."""

    bos: str | None = None
    eos: str | None = None
    unk: str | None = None
    sep: str | None = None
    pad: str | None = None
    cls: str | None = None
    mask: str | None = None
    additional: tuple[str, ...] = ()

    def named(self) -> dict[str, str]:
        """role -> text of the named special tokens the tokenizer has, in SPECIAL_TOKEN_ROLES order."""
        return {role: text for role in SPECIAL_TOKEN_ROLES if (text := getattr(self, role)) is not None}


# The named roles of SpecialTokens, in transformers' order (its special_tokens_map).
SPECIAL_TOKEN_ROLES = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")


@runtime_checkable
class Tokenizer(Protocol):
    """What every backend provides. Ids are ints in [0, vocab_size)."""

    name: str

    @property
    def vocab_size(self) -> int: ...

    @property
    def special_tokens(self) -> SpecialTokens: ...

    @property
    def special_token_ids(self) -> frozenset[int]:
        """Ids that skip_special_tokens=True removes from decode output."""
        ...

    @property
    def eos_token_ids(self) -> frozenset[int]: ...

    def encode(self, text: str, add_special_tokens: bool = False) -> Encoding: ...

    def encode_ids(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """encode(text, add_special_tokens).ids, without the offsets (a prompt's encode needs only its ids)."""
        ...

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = False) -> list[Encoding]: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str: ...

    def token_to_id(self, token: str) -> int | None: ...

    def id_to_token(self, token_id: int) -> str | None: ...

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        documents: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = False,
        continue_final_message: bool = False,
        **template_kwargs: Any,
    ) -> str: ...


# Optional capabilities a backend may have beside the Tokenizer protocol; code that can use one asks
# isinstance(tokenizer, Capability) (a few microseconds: where it runs per request, bind the answer once).


@runtime_checkable
class ChecksIds(Protocol):
    """An id rule of the backend's own: some ids inside [0, vocab_size) name no token (cl100k_base's 100256)."""

    def check_ids(self, ids: Sequence[int]) -> None:
        """Raise InvalidTokenIdError naming the first id that names no token."""
        ...


@runtime_checkable
class HasTokenBytes(Protocol):
    """Offers the bytes of every token (`TokenBytesTable`): the byte-level fast path, verified before use."""

    def token_bytes_table(self) -> TokenBytesTable | None: ...


@runtime_checkable
class DecodesBatch(Protocol):
    """Decodes several id lists in one call (one call into a native library)."""

    def decode_batch(self, sequences: Sequence[Sequence[int]], skip_special_tokens: bool = False) -> list[str]: ...


@runtime_checkable
class KnowsAddedTokens(Protocol):
    """Says which tokens are added ones (Hugging Face `tokenizers`), for vLLM's spaces_between_special_tokens."""

    def added_token_contents(self) -> Mapping[int, str] | None: ...


@runtime_checkable
class MarksWordStarts(Protocol):
    """Writes a word's leading space as a marker character in its pieces (a Metaspace pre-tokenizer's "▁"), which
    the decode of a piece alone strips: token strings put it back (`TokenStrings`)."""

    def word_start_marker(self) -> str | None: ...


@runtime_checkable
class BuildsLazily(Protocol):
    """Defers its costliest part (building the library tokenizer) to the first use that needs it."""

    def ensure_built(self, *, for_encoding: bool = False) -> object:
        """Build it now (a process whose first request must not wait for it); `for_encoding`: the process encodes
        prompts, and the backend may build what makes that faster."""
        ...


@runtime_checkable
class Fingerprinted(Protocol):
    """Names its content (e.g. the sha256 of the file it was loaded from): the key of the disk caches."""

    def content_fingerprint(self) -> str | None: ...


@runtime_checkable
class WrapsTokenizer(Protocol):
    """A wrapper (the encode cache, the metrics recorder) around the tokenizer that does the work."""

    inner: Tokenizer


def id_check(tokenizer: Tokenizer) -> Callable[[Sequence[int]], None]:
    """The tokenizer's id rule as one function (raises InvalidTokenIdError): its own check_ids (ChecksIds), else
    [0, vocab_size). Every place that accepts ids from outside (prompts, stop token ids) checks them with it."""
    if isinstance(tokenizer, ChecksIds):
        return tokenizer.check_ids
    return functools.partial(check_token_ids, vocab_size=tokenizer.vocab_size)


def validate_token_ids(tokenizer: Tokenizer, ids: Sequence[int]) -> None:
    """id_check(tokenizer)(ids), for a place that checks ids once."""
    id_check(tokenizer)(ids)


def added_token_contents(tokenizer: Tokenizer) -> Mapping[int, str] | None:
    """id -> content of the tokenizer's added tokens (special or not), for a backend that knows them (its
    `added_token_contents`: Hugging Face `tokenizers`, the tokenizers vLLM's fast detokenizer serves); None for one
    that does not say."""
    return tokenizer.added_token_contents() if isinstance(tokenizer, KnowsAddedTokens) else None
