"""The generation routes, POST /v1/completions and /v1/chat/completions (stream or not), on the Front's parts
(app.py): decode and check the request, tokenize its prompt (on the event loop when it is short, else on a thread),
submit one engine request per choice (choices.py), then answer with an SSE stream (its head once every choice has
output: a request the engine refuses at admission gets that status instead) or one JSON body, releasing the engine
requests when the response ends, fails or loses its client. The chunk and body shapes: responses.py and sse.py. A
completions request with several prompts runs each as such a request and answers with their merge, or one stream of
all their choices (prompt_batch.py).
While the front drains (`draining`) new generations get a 503 with Retry-After.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, cast

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from detok_worker.bus.messages import PromptLogprobs, RequestParams
from detok_worker.front import edge, sse
from detok_worker.front.anthropic_api import (
    CountTokensResponse,
    MessagesFormatter,
    anthropic_error_response,
    decode_count_tokens,
    decode_messages,
)
from detok_worker.front.choices import Choices, choice_params, choice_rids, finished_streams
from detok_worker.front.dispatch import SHUTTING_DOWN, Dispatcher
from detok_worker.front.edge import ConnectionWriter, EventSink, request_rid
from detok_worker.front.errors import ENGINE_ERROR, JSON, APIError, bad_request, error_response
from detok_worker.front.openai_api import ChatCompletionRequest, CompletionRequest, PromptLogprobsOut
from detok_worker.front.openai_responses import (
    ResponsesFormatter,
    ResponseStore,
    decode_responses,
    responses_error,
    responses_error_response,
)
from detok_worker.front.parsing import ParserChoice
from detok_worker.front.prompt_batch import BatchFormatter, batch_prompts, merged_body, one_prompt
from detok_worker.front.prompt_logprobs import (
    PromptLogprobsError,
    arrived,
    echo_logprobs,
    prompt_info,
    render_prompt_logprobs,
)
from detok_worker.front.prompts import (
    chat_echo_text,
    chat_prompt_ids,
    chat_prompt_text,
    completion_prompt_ids,
    echo_text,
    prompt_chars,
)
from detok_worker.front.request_intake import RequestIntake
from detok_worker.front.request_log import OutputLog, log_request
from detok_worker.front.responses import (
    ChatFormatter,
    ChunkUsage,
    Collected,
    CompletionFormatter,
    Formatter,
    TokenIds,
)
from detok_worker.front.validation import (
    CheckedParams,
    Limits,
    check_generation,
    check_model,
    decode_chat,
    decode_completion,
    truncate_prompt,
    with_vllm_headers,
)
from detok_worker.tokenizer.protocol import Tokenizer

# A prompt this short is rendered and tokenized on the loop: the hand-off to a thread (its wakeups and the GIL
# passed back and forth) costs more CPU than the work, which holds up the loop about a millisecond at most.
INLINE_PROMPT_CHARS = 4096
RETRY_AFTER_S = 5  # what a request refused while draining is told
GenerationBody = CompletionRequest | ChatCompletionRequest


@dataclass(slots=True)
class Prepared:
    """One prompt's request, submitted: its choices, how its answer is shaped, what its whole answer needs of it:
    the prompt's ids, the prompt logprobs asked (of choice 0's engine request), and for an echoed completion with
    logprobs the top candidates its entries start with for the prompt's tokens (when the engine scored them)."""

    choices: Choices
    formatter: Formatter
    ids: list[int]
    prompt_k: int | None
    echo_k: int | None


class Generation:
    def __init__(
        self,
        tokenizer: Tokenizer,
        limits: Limits,
        parsers: ParserChoice,
        dispatcher: Dispatcher,
        intake: RequestIntake,
        context_length: Callable[[], int | None] = lambda: None,
    ) -> None:
        """`context_length`: the model's max_model_len as the front knows it now (None: not known)."""
        self.tokenizer = tokenizer
        self.limits = limits
        self.parsers = parsers
        self.dispatcher = dispatcher
        self.intake = intake
        self.context_length = context_length
        self.draining = False  # set on SIGTERM (Front.drain): new requests get 503, live ones may finish
        self.open_event_streams = 0
        self.response_store = ResponseStore(intake.config.responses_store_max)  # /v1/responses (store, GET)

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, decode_completion, CompletionFormatter, "cmpl-")

    async def chat_completions(self, request: Request) -> Response:
        return await self._generate(request, decode_chat, ChatFormatter, "chatcmpl-")

    async def messages(self, request: Request) -> Response:
        """Anthropic's POST /v1/messages: a chat request in another shape (anthropic_api.py), answered and refused
        in Anthropic's shapes; its API key may come in x-api-key."""
        request.state.anthropic = True
        try:
            response = await self._generate(request, decode_messages, MessagesFormatter, "msg_")
        except APIError as exc:
            return anthropic_error_response(error_response(exc))
        return anthropic_error_response(response)

    async def responses(self, request: Request) -> Response:
        """OpenAI's POST /v1/responses: a chat request in another shape (openai_responses.py); a stored response is
        kept for previous_response_id and GET once it has finished."""
        store = self.response_store

        def decode(body: bytes) -> ChatCompletionRequest:
            chat, asked = decode_responses(body, store)
            request.state.responses = (asked, chat.messages)  # what its formatter answers and keeps
            return chat

        def formatter(*args: Any, **kwargs: Any) -> ResponsesFormatter:
            made = ResponsesFormatter(*args, **kwargs)
            made.bind(
                *request.state.responses,
                store,
                self.limits.vllm_server,
                self.context_length(),
                self.dispatcher.engine_sampling_defaults,
            )
            return made

        try:
            response = await self._generate(request, decode, cast(Any, formatter), "resp_")
        except APIError as exc:
            return error_response(responses_error(exc))
        return responses_error_response(response)

    async def stored_response(self, request: Request) -> Response:
        """GET /v1/responses/{response_id}: a stored response as it was answered."""
        self.intake.authorize(request)
        return Response(self.response_store.get(request.path_params["response_id"]).body, media_type=JSON)

    async def cancel_response(self, request: Request) -> Response:
        """POST /v1/responses/{response_id}/cancel: only a background response can be cancelled, and detok runs
        none (background is refused), so a stored one is a 400 (as vLLM's server answers a synchronous one)."""
        self.intake.authorize(request)
        self.response_store.get(request.path_params["response_id"])
        raise bad_request("only a background response can be cancelled; this one has finished", "response_id")

    async def count_tokens(self, request: Request) -> Response:
        """Anthropic's POST /v1/messages/count_tokens: the prompt's length as a Messages request would render it."""
        request.state.anthropic = True
        try:
            self.intake.authorize(request)
            body = decode_count_tokens(await self.intake.read_body(request))
            check_model(body.model, self.limits, self.dispatcher.engine_model_name)
            ids = await self.intake.off_loop(chat_prompt_ids, body, self.tokenizer, self.limits)
        except APIError as exc:
            return anthropic_error_response(error_response(exc))
        return Response(msgspec.json.encode(CountTokensResponse(len(ids))), media_type=JSON)

    async def _generate(
        self,
        request: Request,
        decode: Callable[[bytes], GenerationBody],
        formatter_type: type[CompletionFormatter] | type[ChatFormatter],
        id_prefix: str,
    ) -> Response:
        if self.draining:
            return error_response(SHUTTING_DOWN, {"Retry-After": str(RETRY_AFTER_S)})
        self.intake.authorize(request)
        body = with_vllm_headers(
            decode(await self.intake.read_body(request)), request.headers, self.dispatcher.engine_refuses
        )
        rid = request_rid(request, id_prefix, body.request_id)
        prompts = batch_prompts(body) if isinstance(body, CompletionRequest) else None
        if prompts is None:
            return await self._generate_one(request, body, formatter_type, rid)
        assert isinstance(body, CompletionRequest)
        # every prompt checked and submitted before any answer is read; one refused: those submitted are released
        wakeup = asyncio.Event() if body.stream else None  # streamed: one stream waits for news from any prompt
        parts: list[Prepared] = []
        try:
            for index, prompt in enumerate(prompts):
                event = wakeup or asyncio.Event()
                part = await self._prepare(one_prompt(body, prompt), CompletionFormatter, f"{rid}-{index}", rid, event)
                parts.append(part)
        except BaseException:
            for part in parts:
                self._release(part.choices)
            raise
        per_prompt = len(parts[0].choices.streams)
        choices = Choices(rid, [stream for part in parts for stream in part.choices.streams], per_prompt)
        self._count(request, choices)
        if body.stream:
            formatter = BatchFormatter([cast(CompletionFormatter, part.formatter) for part in parts], per_prompt)
            return await self._stream(request, choices, formatter, parts)
        answers = await asyncio.gather(*(self._collect(request, part) for part in parts))
        for answer in answers:
            if answer.status_code != 200:
                for part in parts:
                    self._release(part.choices)
                return answer
        bodies = [msgspec.json.decode(bytes(answer.body)) for answer in answers]
        return Response(msgspec.json.encode(merged_body(rid, bodies)), media_type=JSON)

    async def _generate_one(
        self,
        request: Request,
        body: GenerationBody,
        formatter_type: type[CompletionFormatter] | type[ChatFormatter],
        rid: str,
    ) -> Response:
        prepared = await self._prepare(body, formatter_type, rid, rid, asyncio.Event())
        choices, formatter = prepared.choices, prepared.formatter
        self._count(request, choices)
        config = self.intake.config
        log = None
        if formatter_type is ChatFormatter and config.log_requests and config.log_outputs:
            log = OutputLog(rid, config.max_log_len, config.log_deltas)  # vLLM logs chat outputs only
        if body.stream:
            return await self._stream(request, choices, formatter, [prepared], log)
        response = await self._collect(request, prepared)
        if log is not None and response.status_code == 200:
            log.whole(msgspec.json.decode(bytes(response.body)))
        return response

    async def _prepare(
        self,
        body: GenerationBody,
        formatter_type: type[CompletionFormatter] | type[ChatFormatter],
        rid: str,
        response_id: str,
        wakeup: asyncio.Event,
    ) -> Prepared:
        """Check a request of one prompt, tokenize it, shape its answer and submit its choices (rids from `rid`, the
        answer's id `response_id`, their streams woken by `wakeup`); nothing is submitted when a check fails."""
        model = check_model(body.model, self.limits, self.dispatcher.engine_model_name)
        checked = check_generation(body, self.limits, self.dispatcher.engine_vocab_size, self.dispatcher.engine_refuses)
        params = checked.params
        if isinstance(body, ChatCompletionRequest):
            params = self.parsers.for_chat(body, params)
        if model in self.limits.lora_adapters:  # the request runs on that adapter
            params = msgspec.structs.replace(params, lora=model)
        encode: Callable[..., list[int]] = chat_prompt_ids
        if isinstance(body, CompletionRequest):
            encode = completion_prompt_ids
        size = prompt_chars(body)
        if size is not None and size <= INLINE_PROMPT_CHARS:
            ids = encode(body, self.tokenizer, self.limits)
        else:  # chat template + tokenizing of a long prompt: off the loop
            ids = await self.intake.off_loop(encode, body, self.tokenizer, self.limits)
        ids = truncate_prompt(ids, body, self.context_length())
        echo = None
        chat: dict[str, Any] = {}
        if isinstance(body, CompletionRequest):
            if checked.echo:  # with return_token_ids: the ids, not the text
                echo = "" if body.return_token_ids else await self.intake.off_loop(echo_text, body, ids, self.tokenizer)
        else:
            chat = self.chat_shape(body)
            if body.echo:
                echo = chat_echo_text(body, chat["role"])
            if body.return_prompt_text:
                chat["prompt_text"] = await self.intake.off_loop(chat_prompt_text, body, self.tokenizer, self.limits)
        if self.intake.config.log_requests:
            log_request(rid, params, ids, self.intake.config.max_log_len)
        reasoning_tokens = isinstance(body, ChatCompletionRequest) and self.intake.config.reasoning_tokens_details
        usage = ChunkUsage(checked.include_usage, checked.continuous_usage, reasoning_tokens)
        token_ids = TokenIds(ids) if body.return_token_ids else None
        fingerprint = self.dispatcher.system_fingerprint
        as_ids = body.return_tokens_as_token_ids
        as_ids = self.intake.config.return_tokens_as_token_ids if as_ids is None else as_ids
        formatter = formatter_type(
            response_id, model, usage, echo, params.sampling.logprobs is not None, token_ids, fingerprint, as_ids,
            **chat,
        )  # fmt: skip
        choices = self._submit(ids, params, checked, rid, wakeup)
        echo_k = body.logprobs if echo is not None and isinstance(body, CompletionRequest) else None
        return Prepared(choices, formatter, ids, params.sampling.prompt_logprobs, echo_k)

    def _count(self, request: Request, choices: Choices) -> None:
        request.state.stream = choices  # for the access log and the TTFT / latency metrics (request_log.py)
        self.dispatcher.metrics.request(edge.route_path(request.scope))  # a generation route (without root_path)

    async def _stream(
        self,
        request: Request,
        choices: Choices,
        formatter: Formatter | BatchFormatter,
        parts: list[Prepared],
        log: OutputLog | None = None,
    ) -> Response:
        """`log`: the output log that sees every piece (the bus intake then writes none: sse_direct). `parts`: the
        prompts' requests; an echoed completion's with logprobs (prompt_k: the engine scores its prompt) sends its
        prompt's logprobs on its first chunk, so the stream waits for them (the engine sent them at the prefill's
        end, as the first output)."""
        watch = await self._first_output(request, choices)
        if isinstance(watch, APIError):
            return error_response(watch)
        try:
            for part in parts:
                if part.prompt_k is not None and part.choices.failure is None:
                    await self._shown_prompt_logprobs(part, await arrived(part.choices.streams[0]))
        except BaseException as exc:
            watch.cancel()
            self._release(choices)
            if isinstance(exc, APIError):
                return error_response(exc)
            raise
        writer = edge.connection_writer(request.scope) if log is None else None
        if writer is not None and not _attach_sinks(choices, formatter, writer):
            writer = None
        events = self._events(choices, formatter, writer, log)
        return sse.EventStreamResponse(events, lambda: self._release(choices), writer=writer, watch=watch)

    def chat_shape(self, body: ChatCompletionRequest) -> dict[str, Any]:
        """How a chat answer is shaped (ChatFormatter's options): where it carries its reasoning (front.reasoning_field,
        or nowhere: include_reasoning false), the calls its tool_choice forces, whether it keeps more than one call,
        its role (front.response_role when the prompt asks for an answer, else the last message's: vLLM's rule)."""
        last_role = body.messages[-1].get("role") if body.messages and isinstance(body.messages[-1], dict) else None
        asks = body.add_generation_prompt is not False
        return {
            "role": self.intake.config.response_role if asks or not isinstance(last_role, str) else last_role,
            "reasoning_field": "" if body.include_reasoning is False else self.intake.config.reasoning_field,
            "forced_calls": self.parsers.forced_shape(body),
            "parallel_tool_calls": body.parallel_tool_calls is not False,
        }

    def _submit(
        self, ids: list[int], params: RequestParams, checked: CheckedParams, rid: str, wakeup: asyncio.Event
    ) -> Choices:
        """One engine request per choice (none for echo with max_tokens 0: the answer is the prompt)."""
        rids = choice_rids(rid, checked.n)
        if params.max_tokens == 0:
            return Choices(rid, finished_streams(rids, len(ids), checked.stop_rules, wakeup))
        requests = list(zip(rids, choice_params(params, checked.n), strict=True))
        return Choices(rid, self.dispatcher.submit_choices(ids, requests, checked.stop_rules, wakeup))

    async def _first_output(self, request: Request, choices: Choices) -> APIError | sse.DisconnectWatch:
        """Hold a stream's response head until every choice has its first delta (or has ended): a request the engine
        refuses at admission (its Reject's kind: no worker has room for its stop strings, its limits, no live worker)
        gets that status, never a 200 and then an error event. Other failures end the stream as before (an error
        event, after any text). With SSE keep-alives (front.sse_keep_alive_s) the head waits that long at most, then
        goes (a later refusal is an error event). Returns the refusal, if any (its streams released), else the watch
        on the client's disconnect, for the response to take over."""
        watch = sse.DisconnectWatch(request.receive, lambda: self._abort_disconnected(choices))
        try:
            with contextlib.suppress(TimeoutError):  # keep-alives: the head goes now, comments while it waits
                await asyncio.wait_for(choices.started(), self.intake.config.sse_keep_alive_s or None)
        except BaseException:
            watch.cancel()
            self._release(choices)
            raise
        refused = choices.refused
        if refused is not None:
            watch.cancel()
            self._release(choices)
            return refused
        return watch

    async def _cached_tokens(self, choices: Choices) -> None:
        """The usage's cached prompt tokens, when the front reports them: the engine sent them at the prefill's end
        (to choice 0's request), on another connection than the text."""
        first = choices.streams[0]
        if self.limits.prompt_tokens_details and choices.failure is None and first.answered:
            await prompt_info(first, lambda: first.cached_tokens is not None)

    def _release(self, choices: Choices) -> None:
        for stream in choices.streams:
            if not stream.done:  # the client went away, the server is stopping, or another choice failed
                self.dispatcher.abort(stream)
            self.dispatcher.release(stream)

    async def _events(
        self,
        choices: Choices,
        formatter: Formatter | BatchFormatter,
        writer: ConnectionWriter | None,
        log: OutputLog | None = None,
    ) -> AsyncIterator[bytes]:
        """The response's events. With a writer (its streams have sinks) the text that arrives while
        this generator waits for news is written by the intake; what it finds buffered (the connection was busy) it
        writes itself."""
        metrics = self.dispatcher.metrics
        framing = formatter.framing
        metrics.sse_opened()
        self.open_event_streams += 1
        with_ids = formatter.token_ids is not None
        keep_alive = self.intake.config.sse_keep_alive_s
        try:
            # each choice's first chunk (the role; echo), in one write with the first round when that has news
            ready: list[bytes] = []
            for index, stream in enumerate(choices.streams):
                ready += [framing.event(first) for first in formatter.first_chunks(index, stream)]
            if ready and not any(stream.has_news or stream.done for stream in choices.streams):
                yield b"".join(ready)
                ready = []
            while True:  # after the end (or a failure) one more round: the text that came with it
                if writer is not None and not ready:
                    writer.arm()  # nothing in hand: the intake may write what comes while we wait
                try:
                    changes = await (
                        asyncio.wait_for(choices.changes(), keep_alive) if keep_alive else choices.changes()
                    )
                except TimeoutError:  # nothing for keep_alive seconds: a comment keeps proxies from closing it
                    changes = None
                if writer is not None:
                    writer.armed = False
                if changes is None:
                    ready.append(sse.KEEP_ALIVE)
                    yield b"".join(ready)
                    ready = []
                    continue
                for index, news, ended in changes:
                    stream = choices.streams[index]
                    if log is not None:
                        log.piece(index, news, stream.finish if ended else None)
                    logprobs = stream.take_logprobs()
                    ids = stream.take_token_ids() if with_ids else None
                    if news or logprobs or ids:
                        ready.append(framing.event(formatter.text_chunk(index, news, stream, logprobs, ids)))
                    if ended and stream.failure is None:
                        ready.append(framing.event(formatter.final_chunk(index, stream)))
                if choices.finished:
                    break
                if ready:
                    yield ready[0] if len(ready) == 1 else b"".join(ready)
                    ready = []  # the events of one round go out in one write
            failure = choices.failure
            if failure is not None:
                self._release(choices)  # one choice failed: the whole request ends with its error (as vLLM)
                ready.append(framing.error_event(failure))
            elif formatter.include_usage:
                await self._cached_tokens(choices)
                ready.append(framing.event(formatter.usage_chunk(choices)))
            if failure is None and log is not None:
                log.stream_end(len(choices.streams))
            yield b"".join([*ready, framing.end])
        finally:
            if writer is not None:
                writer.armed = False
                for stream in choices.streams:
                    stream.sink = None
            metrics.sse_closed()
            self.open_event_streams -= 1

    async def _collect(self, request: Request, prepared: Prepared) -> Response:
        """The whole answer of one prompt's request."""
        choices, formatter, prompt_k = prepared.choices, prepared.formatter, prepared.prompt_k
        watcher = sse.DisconnectWatch(request.receive, lambda: self._abort_disconnected(choices))
        collected = Collected(
            [[] for _ in choices.streams], [[] for _ in choices.streams], [[] for _ in choices.streams]
        )
        prompt_logprobs: PromptLogprobs | None = None
        try:
            while True:
                for index, news, _ in await choices.changes():
                    collected.pieces[index].append(news)
                    collected.logprobs[index] += choices.streams[index].take_logprobs()
                    collected.token_ids[index] += choices.streams[index].take_token_ids()
                if choices.finished:
                    break
            await self._cached_tokens(choices)
            if prompt_k is not None and choices.failure is None:
                prompt_logprobs = await arrived(choices.streams[0])
        except APIError as exc:
            return error_response(exc)
        finally:
            watcher.cancel()
            self._release(choices)
        if choices.failure is not None:
            return error_response(choices.failure)
        if prompt_logprobs is not None:
            try:
                collected.prompt_logprobs = await self._shown_prompt_logprobs(prepared, prompt_logprobs)
            except APIError as exc:
                return error_response(exc)
        return Response(formatter.whole(collected, choices), media_type=JSON)

    async def _shown_prompt_logprobs(self, prepared: Prepared, prompt_logprobs: PromptLogprobs) -> PromptLogprobsOut:
        """The prompt logprobs as the answer shows them; an echoed completion's formatter gets its prompt's part of
        the `logprobs` (echoed_logprobs). An APIError (502) when the engine's are unusable."""
        assert prepared.prompt_k is not None
        try:
            shown = await self.intake.off_loop(
                render_prompt_logprobs, prompt_logprobs, prepared.ids, prepared.prompt_k, self.tokenizer
            )
        except PromptLogprobsError as exc:
            raise APIError(502, f"the engine's prompt logprobs are unusable: {exc}", type=ENGINE_ERROR) from exc
        formatter = prepared.formatter
        if prepared.echo_k is not None and isinstance(formatter, CompletionFormatter):
            formatter.echoed_logprobs = await self.intake.off_loop(
                echo_logprobs, prepared.ids, shown, prepared.echo_k, self.tokenizer
            )
        return shown

    def _abort_disconnected(self, choices: Choices) -> None:
        error = APIError(499, "the client closed the connection", code="disconnected")
        for stream in choices.streams:
            self.dispatcher.abort(stream, error)


def _attach_sinks(choices: Choices, formatter: Formatter | BatchFormatter, writer: ConnectionWriter) -> bool:
    """Give every choice's stream an EventSink on `writer` when all their chunks are plain text; False if not."""
    events = [formatter.text_event(index, stream) for index, stream in enumerate(choices.streams)]
    if any(event is None for event in events):
        return False
    for stream, event in zip(choices.streams, events, strict=True):
        assert event is not None
        stream.sink = EventSink(writer, event)
    return True
