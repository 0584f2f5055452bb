"""What a StopSequenceDecoder (decoder.py) returns: per id (process_one, process_token: Text, Held, Stopped,
StoppedWithText) and per batch of one request's ids (process_tokens: StopBatchOutput). Immutable, no cycles (gc=False):
the worker makes one per item."""

from __future__ import annotations

import msgspec

StopReason = str | int  # the stop string or the stop token id that stopped a request


class Text(msgspec.Struct, frozen=True, gc=False):
    """New text, released now."""

    text: str


class Held(msgspec.Struct, frozen=True, gc=False):
    """Nothing to release yet: text is held back as a possible stop-string start, or a character is incomplete."""

    @property
    def text(self) -> str:
        return ""


class Stopped(msgspec.Struct, frozen=True, gc=False):
    """The request has stopped (now or earlier) and there is no more text."""

    stop_reason: StopReason

    @property
    def text(self) -> str:
        return ""


class StoppedWithText(msgspec.Struct, frozen=True, gc=False):
    """The request stops now; `text` is its last text."""

    text: str
    stop_reason: StopReason


StopOutput = Text | Held | Stopped | StoppedWithText
HELD = Held()


class StopBatchOutput(msgspec.Struct, frozen=True, gc=False):
    """Result of process_tokens for one request's new ids in one engine step.

    text: everything released by these ids. stopped: the request has stopped (by these ids or earlier).
    stop_reason: the matched stop string or stop token id (None if not stopped). consumed: how many of the ids
    were processed, up to and including the one that completed the stop, or up to the bad one (0 once stopped).
    error: the message of an InvalidTokenIdError; the ids before the bad one are processed, none after it.
    unknown_ids: how many of the consumed ids the tokenizer lacks but the model can emit (model_vocab_size); their
    text is nothing.
    """

    text: str
    stopped: bool = False
    stop_reason: StopReason | None = None
    consumed: int = 0
    error: str | None = None
    unknown_ids: int = 0


ONE_UNKNOWN_ID = StopBatchOutput("", False, None, 1, None, 1)  # process_one of an id the model can emit, no text
