"""The exactly-once rule for one request's text, used by every receiver of TextDeltas (the HTTP front, the bus
collector that tests, benches and `detok trace replay` use).

Each TextDelta says at which character of the request's output its text starts (`offset`). A receiver keeps
how many characters it has delivered. A delta that starts at or before that point gives only the part not
delivered yet (after a worker dies, the engine re-opens the request elsewhere and the new worker re-sends the
text from offset 0). A delta that starts past it is a gap: characters were lost on the way, so no later text of
that request can be delivered in the right place. `take` then returns None, delivers nothing, and the receiver
ends the request with GAP_ERROR: a client gets an error, never a text with a hole in it.
"""

from __future__ import annotations

from detok_worker.bus.messages import TextDelta

GAP_ERROR = "text of this request was lost between the detokenizer and the front (a gap in its deltas)"


class DeltaReassembly:
    __slots__ = ("delivered", "duplicate_chars", "gap")

    def __init__(self) -> None:
        self.delivered = 0  # characters of output delivered so far
        self.duplicate_chars = 0  # re-sent characters dropped
        self.gap = False

    def take(self, delta: TextDelta) -> str | None:
        """The part of `delta.text` not delivered yet (possibly ""); None on a gap."""
        skip = self.delivered - delta.offset
        if skip < 0:
            self.gap = True
            return None
        text = delta.text[skip:] if skip else delta.text
        self.duplicate_chars += len(delta.text) - len(text)
        self.delivered += len(text)
        return text
