"""DecodeStream: one request's incremental detokenization, token id in, text delta out.

The implementations: the byte-level fast paths (byte_level.py, byte_fallback.py) when the tokenizer's decode is
verified to be a byte concatenation (fast_path.py), else the generic window-diff algorithm (generic.py).
select.py's `create_decode_stream(tokenizer, prompt_ids, skip_special_tokens)` is the factory that picks one;
`DecodeStream(tokenizer, ...)` (the public constructor) returns what it picks. `stream.fast_path` says which;
`force_generic=True` picks the generic one (tests and benchmarks compare the two).

Contract, for every implementation:
- The text of all step() results plus flush() is `decode(prompt + generated)[len(decode(prompt)):]`, i.e. exactly
  `decode(generated)` without a prompt. A character split between the prompt and the output belongs to the prompt
  and is not emitted.
- A character is emitted by the step that completes it. Only text that can still change is withheld: an
  incomplete UTF-8 sequence at the end, or (byte-fallback decoders) a trailing run of byte tokens. The generic
  algorithm cannot see bytes, so it also withholds a trailing run of U+FFFD (see generic.py).
- An id outside the vocabulary raises InvalidTokenIdError naming it and leaves the stream unchanged; step_batch
  checks the whole batch before decoding any of it.
- flush() releases everything still withheld. The stream stays usable: later ids continue the text as if
  everything so far had been the prompt (the characters flush() released are not emitted again).
- Retained state is bounded: the stream keeps a few ids of context, never the whole history.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

from detok_worker.stream.decode.tables import FeedMemo
from detok_worker.tokenizer.protocol import Tokenizer

Factory = Callable[..., "DecodeStream"]
_factory: list[Factory] = []  # select.py registers create_decode_stream here when the package is imported


def register_factory(factory: Factory) -> None:
    _factory[:] = [factory]


class DecodeStream(ABC):
    """Incremental detokenizer for one request; see the module docstring for the exact contract."""

    __slots__ = ("tokenizer", "skip_special_tokens")
    fast_path: bool = False  # True for the byte-level fast path implementations

    def __new__(
        cls,
        tokenizer: Tokenizer,
        prompt_ids: Sequence[int] = (),
        skip_special_tokens: bool = False,
        *,
        force_generic: bool = False,
    ) -> DecodeStream:
        if cls is not DecodeStream:
            return super().__new__(cls)
        if not _factory:
            raise RuntimeError("import detok_worker.stream (or .stream.decode) to construct a DecodeStream")
        return _factory[0](tokenizer, prompt_ids, skip_special_tokens, force_generic=force_generic)

    def __init__(self, *args: object, **kwargs: object) -> None:  # noqa: B027 - deliberately empty
        """Implementations are set up by their `open` classmethod, which the factory calls: Python calls this
        again on what `DecodeStream(...)` returns, so it must do nothing."""

    @abstractmethod
    def step(self, token_id: int) -> str | None:
        """Add one generated id; return the text it completes, or None if it completes none."""

    @abstractmethod
    def step_batch(self, ids: Sequence[int]) -> list[str]:
        """step() for each id in order: one entry per id, '' where that id emitted nothing."""

    @abstractmethod
    def flush(self) -> str | None:
        """Release everything still withheld (an incomplete character becomes U+FFFD); None if nothing was."""

    @abstractmethod
    def pending_text(self) -> str:
        """What flush() would release now, without releasing it."""

    def lookup_tables(self) -> tuple[Sequence[str | None] | None, FeedMemo | None]:
        """What a caller may step this stream by, instead of step() (StopSequenceDecoder.process_one's first branch):
        (table, memo). With no memo, the table stands for step() right now: for an id i >= 0 with table[i] not None,
        step(i) returns table[i] and leaves the stream as it was, so the table stays valid for any run of such steps;
        None when no such table holds now (bytes of an unfinished character are pending, or the stream has no
        table). With a memo (the byte-level stream, whose `pending` is the bytes of an unfinished character): for an
        id i, texts[i] while nothing is pending, else memo[(pending, i)] = (text, pending after) where present, is
        what step(i) returns, and the caller sets `pending` to the bytes after."""
        return None, None

    @property
    @abstractmethod
    def tokens(self) -> tuple[int, ...]:
        """The ids the stream still holds: its decoding context and the ids whose text is still withheld.

        Bounded; not the whole history. The generic path holds its window; the byte-level fast path holds only
        bytes of an unfinished character (so this is empty there); the byte-fallback one holds an open byte run.
        """
