"""The n choices of one generation request.

n > 1 fans out as vLLM does: one engine request per choice (rid `<rid>-<i>`; with a seed, choice i samples with
seed + i, as vLLM's parallel sampling does), each an independent stream with its own stop state and finish.
Their streams share one wakeup event so that one handler waits for news from any of them. The request fails
as a whole when one choice fails (vLLM ends the request with the error): the handler then aborts the others.
"""

from __future__ import annotations

import asyncio

import msgspec

from detok_worker.bus.messages import RequestParams
from detok_worker.front.errors import APIError
from detok_worker.front.openai_api import CompletionTokensDetails, PromptTokensDetails, Usage
from detok_worker.front.request_stream import RequestStream
from detok_worker.parse.base import ParsedOutput
from detok_worker.stream.stop.rules import StopRules

FINISH_LENGTH = "length"


def choice_rids(rid: str, n: int) -> list[str]:
    """n = 1 keeps the request's own rid (what a client's X-Request-Id shows in the engine's logs)."""
    return [rid] if n == 1 else [f"{rid}-{index}" for index in range(n)]


def choice_params(params: RequestParams, n: int) -> list[RequestParams]:
    """Choice i samples with seed + i; only choice 0 asks for the prompt's logprobs and cached tokens (one prompt:
    every choice shows the same ones)."""
    sampling = params.sampling
    if n == 1 or (sampling.seed is None and sampling.prompt_logprobs is None and not params.report_cached):
        return [params] * n
    later = msgspec.structs.replace(sampling, prompt_logprobs=None)
    return [
        msgspec.structs.replace(
            params,
            sampling=msgspec.structs.replace(
                sampling if index == 0 else later, seed=None if sampling.seed is None else sampling.seed + index
            ),
            report_cached=params.report_cached and index == 0,
        )
        for index in range(n)
    ]


def finished_streams(
    rids: list[str], prompt_tokens: int, stop_rules: StopRules, wakeup: asyncio.Event
) -> list[RequestStream]:
    """Choices that end before generating (echo with max_tokens 0): never sent to the engine."""
    streams = [RequestStream(rid, prompt_tokens, 0.0, stop_rules, wakeup=wakeup) for rid in rids]
    for stream in streams:
        stream.finish = FINISH_LENGTH
        stream.done = True
    return streams


Change = tuple[int, "str | ParsedOutput", bool]  # (choice index, its news, whether the choice just ended)


class Choices:
    """The streams of one request's choices, by index."""

    __slots__ = ("rid", "streams", "prompt_tokens", "_ended")

    def __init__(self, rid: str, streams: list[RequestStream], per_prompt: int = 0) -> None:
        """`streams` share one wakeup event. `per_prompt`: the choices of each prompt, for a request with several
        prompts whose streams are the prompts' choices in order (0: one prompt)."""
        self.rid = rid
        self.streams = streams
        # each prompt counted once, as vLLM does
        self.prompt_tokens = sum(stream.prompt_tokens for stream in streams[:: per_prompt or len(streams)])
        self._ended: set[int] = set()

    @property
    def failure(self) -> APIError | None:
        for stream in self.streams:  # a loop, not next() of a generator: asked twice per SSE event
            if stream.failure is not None:
                return stream.failure
        return None

    @property
    def finished(self) -> bool:
        """Every choice ended and was reported by changes(), or one failed."""
        return self.failure is not None or len(self._ended) == len(self.streams)

    # ---- for the access log and the per-request metrics (request_log.py): the request as a whole

    @property
    def n_tokens(self) -> int:
        return sum(stream.n_tokens for stream in self.streams)

    @property
    def finish(self) -> str | None:
        """The choices' finish reason ("stop,length" when they differ); None while one has not finished."""
        finishes = [stream.finish for stream in self.streams]
        if None in finishes:
            return None
        return ",".join(dict.fromkeys(finishes))  # type: ignore[arg-type]

    def ttft_s(self, started: float) -> float | None:
        """Seconds from `started` to the first output of any choice."""
        return min((t for stream in self.streams if (t := stream.ttft_s(started)) is not None), default=None)

    def mean_itl_s(self) -> float | None:
        """The mean over the choices of each one's mean inter-token latency."""
        values = [v for stream in self.streams if (v := stream.mean_itl_s()) is not None]
        return sum(values) / len(values) if values else None

    def usage(self, created: bool = False, reasoning: bool = False) -> Usage:
        """With the engine's cached prompt tokens when it told them (front.prompt_tokens_details); `created`: with the
        tokens its prefill wrote to the prefix cache too (vLLM's chat usage has them, its completions' not);
        `reasoning`: with the reasoning tokens (front.reasoning_tokens_details)."""
        completion = sum(stream.n_tokens for stream in self.streams)
        usage = Usage(self.prompt_tokens, completion, self.prompt_tokens + completion)
        if reasoning:
            usage.completion_tokens_details = CompletionTokensDetails(
                sum(stream.reasoning_tokens for stream in self.streams)
            )
        cached = self.streams[0].cached_tokens
        if cached is not None:
            details = PromptTokensDetails(cached[0])
            if created:
                details.created_cache_tokens = cached[1]
            usage.prompt_tokens_details = details
        return usage

    @property
    def refused(self) -> APIError | None:
        """The failure of a choice the engine refused at admission (before any output): the request never started,
        so that is its response's status."""
        for stream in self.streams:
            if stream.failure is not None and stream.refused:
                return stream.failure
        return None

    async def started(self) -> None:
        """Until every choice has its first delta (or its end), or one failed."""
        while self.failure is None and not all(stream.started for stream in self.streams):
            wakeup = self.streams[0].wakeup
            wakeup.clear()
            await wakeup.wait()

    async def changes(self) -> list[Change]:
        """Wait for news from any choice (or a choice's end); returns each choice's news in index order. Once
        `finished` it returns what is left (text that came with the end or a failure) at once, then []."""
        while True:
            changes: list[Change] = []
            for index, stream in enumerate(self.streams):
                ended = stream.done and index not in self._ended
                if stream.has_news or ended:
                    changes.append((index, stream.take(), ended))
                    if ended:
                        self._ended.add(index)
            if changes or self.finished:
                return changes
            wakeup = self.streams[0].wakeup
            wakeup.clear()
            await wakeup.wait()
