"""A generation request's lines on the `detok.requests` logger, as vLLM's server writes them: the request as it goes
to the engine (front.log_requests) and its output (front.log_outputs). The access log line and the per-request
metrics are the HTTP edge's (edge.RequestObserver)."""

from __future__ import annotations

import logging
from typing import Any

from detok_worker.bus.messages import RequestParams
from detok_worker.parse.base import ParsedOutput

request_log = logging.getLogger("detok.requests")


def log_request(rid: str, params: RequestParams, prompt_ids: list[int], max_len: int) -> None:
    """A generation request as it goes to the engine (front.log_requests): its rid, parameters and prompt ids, at
    most max_len of them (0: all)."""
    shown = prompt_ids[:max_len] if max_len else prompt_ids
    more = f" ... ({len(prompt_ids)} ids)" if len(shown) < len(prompt_ids) else ""
    request_log.info("request %s: params %r, prompt_token_ids %s%s", rid, params, shown, more)


class OutputLog:
    """A chat's output on the `detok.requests` logger (front.log_outputs), in vLLM's server's lines: each streamed
    piece (with front.log_deltas) and each choice's text at the stream's end, or each choice of a whole answer. The
    text is cut to max_len characters (0: all)."""

    def __init__(self, rid: str, max_len: int, deltas: bool) -> None:
        self.rid = rid
        self.max_len = max_len
        self.deltas = deltas
        self._texts: dict[int, list[str]] = {}

    def piece(self, index: int, news: str | ParsedOutput, finish: str | None) -> None:
        """A streamed piece of choice `index` (`finish`: its finish reason when it ended with it)."""
        if isinstance(news, str):
            parts = [news] if news else []
            self._texts.setdefault(index, []).append(news)
        else:
            parts = [news.content] if news.content else []
            if news.reasoning:
                parts.append(f"[reasoning: {news.reasoning}]")
            arguments = "".join(call.arguments for call in news.tool_calls)
            if arguments:
                parts.append(f"[tool_calls: {arguments}]")
            self._texts.setdefault(index, []).append(news.reasoning + news.content)
        if parts and self.deltas:
            self._line(" (streaming delta)", " ".join(parts), finish)

    def stream_end(self, choices: int) -> None:
        for index in range(choices):
            self._line(" (streaming complete)", "".join(self._texts.get(index, ())), "streaming_complete")

    def whole(self, body: dict[str, Any]) -> None:
        """Each choice of a whole chat answer: its content, or its calls."""
        for choice in body.get("choices", ()):
            message = choice.get("message") or {}
            text = message.get("content") or ""
            if not text and message.get("tool_calls"):
                calls = [f"{c['function']['name']}({c['function']['arguments']})" for c in message["tool_calls"]]
                text = f"[tool_calls: {', '.join(calls)}]"
            if text:
                self._line("", text, choice.get("finish_reason"))

    def _line(self, kind: str, text: str, finish: str | None) -> None:
        shown = text[: self.max_len] if self.max_len else text
        request_log.info("Generated response %s%s: output: %r, finish_reason: %s", self.rid, kind, shown, finish)
