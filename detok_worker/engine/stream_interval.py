"""vLLM's `--stream-interval N` on the vLLM source: a request's ids go on to its worker at its first output, then
each time N have gathered, and at its end, as vLLM's output processor sends them; fewer, larger deltas for clients
that do not need every token at once. The text is the same: only where the stream is cut changes."""

from __future__ import annotations

from detok_worker.bus.messages import TokenLogprob


class StreamInterval:
    """The ids (and their logprobs) held per rid since its last send."""

    __slots__ = ("interval", "_held")

    def __init__(self, interval: int) -> None:
        self.interval = interval
        self._held: dict[str, tuple[list[int], list[TokenLogprob] | None]] = {}

    def take(
        self, rid: str, ids: list[int], logprobs: list[TokenLogprob] | None, finished: bool
    ) -> tuple[list[int], list[TokenLogprob] | None] | None:
        """What to send of the rid now (everything held and these), or None to hold them."""
        held = self._held.get(rid)
        if held is None:
            if ids and not finished:  # its first ids go at once; from now on it gathers
                self._held[rid] = ([], None if logprobs is None else [])
            return ids, logprobs
        held_ids, held_logprobs = held
        held_ids.extend(ids)
        if held_logprobs is not None and logprobs is not None:
            held_logprobs.extend(logprobs)
        if finished:
            del self._held[rid]
        elif len(held_ids) >= self.interval:
            self._held[rid] = ([], None if held_logprobs is None else [])
        else:
            return None
        return held_ids, held_logprobs

    def forget(self, rid: str) -> None:
        """The rid ended elsewhere (a stop string, the client gone): what it held is not sent."""
        self._held.pop(rid, None)
