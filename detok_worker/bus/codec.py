"""Encoding and validated decoding of bus frames. A frame that does not decode to an expected message is
counted by kind and skipped (logged once per kind); it never raises into a process loop."""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any, Generic, TypeVar

import msgspec

from detok_worker.bus.columns import MISMATCHED_COLUMNS, columns_ok
from detok_worker.bus.messages import ToEngine, ToFront, ToWorker

log = logging.getLogger(__name__)

M = TypeVar("M")

BAD_UNDECODABLE = "undecodable"  # not msgpack, or not a known message
BAD_SCHEMA = "schema"  # msgpack, but fields of the wrong type/shape
BAD_MULTIPART = "multipart"  # unexpected number of frame parts


class FrameDecoder(Generic[M]):
    """Decodes frames of one direction (ToEngine, ToWorker or ToFront) and counts the bad ones."""

    def __init__(self, message_type: Any, direction: str) -> None:
        self._decoder = msgspec.msgpack.Decoder(message_type)
        self.direction = direction
        self.bad_frames: Counter[str] = Counter()

    def decode(self, frame: bytes | memoryview) -> M | None:
        try:
            message = self._decoder.decode(frame)
        except msgspec.ValidationError as exc:
            self.count_bad(BAD_SCHEMA, exc)
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:
            # msgspec raises UnicodeDecodeError itself (not a DecodeError) for a string that is not UTF-8
            self.count_bad(BAD_UNDECODABLE, exc)
        else:
            if columns_ok(message):
                return message
            self.count_bad(BAD_SCHEMA, f"{type(message).__name__}: {MISMATCHED_COLUMNS}")
        return None

    def count_bad(self, kind: str, detail: object = "") -> None:
        self.bad_frames[kind] += 1
        if self.bad_frames[kind] == 1 or self.bad_frames[kind] % 1000 == 0:
            log.warning("%s: bad frame (%s), %d so far: %s", self.direction, kind, self.bad_frames[kind], detail)


def engine_decoder() -> FrameDecoder[ToEngine]:
    return FrameDecoder(ToEngine, "engine")


def worker_decoder() -> FrameDecoder[ToWorker]:
    return FrameDecoder(ToWorker, "worker")


def front_decoder() -> FrameDecoder[ToFront]:
    return FrameDecoder(ToFront, "front")


encode = msgspec.msgpack.Encoder().encode
