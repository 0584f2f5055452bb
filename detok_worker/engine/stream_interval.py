"""vLLM's `--stream-interval N` on the vLLM source: a request's ids go on to its worker at its first output, then
each time N have gathered, and at its end, as vLLM's output processor sends them; fewer, larger deltas for clients
that do not need every token at once. A request's own `stream_interval` (vLLM's field) raises it for that request,
never below the server's. The text is the same: only where the stream is cut changes."""

from __future__ import annotations

from detok_worker.bus.messages import TokenLogprob


class StreamInterval:
    """The ids (and their logprobs) held per rid since its last send."""

    __slots__ = ("interval", "_held", "_own")

    def __init__(self, interval: int) -> None:
        self.interval = interval
        self._held: dict[str, tuple[list[int], list[TokenLogprob] | None]] = {}
        self._own: dict[str, int] = {}  # rid -> its interval, where the request asked for a larger one

    def ask(self, rid: str, interval: int) -> None:
        """The request's own interval (vLLM clamps it to the server's: the larger one holds)."""
        if interval > self.interval:
            self._own[rid] = interval

    def take(
        self, rid: str, ids: list[int], logprobs: list[TokenLogprob] | None, finished: bool
    ) -> tuple[list[int], list[TokenLogprob] | None] | None:
        """What to send of the rid now (everything held and these), or None to hold them."""
        interval = self._own.get(rid, self.interval) if self._own else self.interval
        if interval <= 1:
            return ids, logprobs
        held = self._held.get(rid)
        if held is None:
            if ids and not finished:  # its first ids go at once; from now on it gathers
                self._held[rid] = ([], None if logprobs is None else [])
            elif finished:
                self._own.pop(rid, None)
            return ids, logprobs
        held_ids, held_logprobs = held
        held_ids.extend(ids)
        if held_logprobs is not None and logprobs is not None:
            held_logprobs.extend(logprobs)
        if finished:
            del self._held[rid]
            self._own.pop(rid, None)
        elif len(held_ids) >= interval:
            self._held[rid] = ([], None if held_logprobs is None else [])
        else:
            return None
        return held_ids, held_logprobs

    def forget(self, rid: str) -> None:
        """The rid ended elsewhere (a stop string, the client gone): what it held is not sent."""
        self._held.pop(rid, None)
        self._own.pop(rid, None)
