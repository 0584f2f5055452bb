"""The token-only gRPC engine API (SMG's protocol, PyPI `smg-grpc-proto`) as the gateway uses it: the connection
and its start-up check (the service, health, model info, tokenizer), and the ids and logprobs of its answers. The
services and their requests: `Dialect`; `engine.engine_service = "auto"` asks VllmEngine first.
"""

from __future__ import annotations

import asyncio
import io
import logging
import tempfile
import zipfile
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import grpc
from smg_grpc_proto.generated import common_pb2

from detok_worker.bus.messages import FINISH_LENGTH, FINISH_STOP, TokenLogprob
from detok_worker.engine.grpc_dialects import AUTO_ORDER, DIALECTS, Dialect
from detok_worker.errors import OperatorError
from detok_worker.tokenizer.protocol import Tokenizer
from detok_worker.trace.format import tokenizer_fingerprint

log = logging.getLogger(__name__)

# a model's embedding table is often padded past the tokenizer's vocabulary (to a multiple of 64..1024)
VOCAB_PADDING_LIMIT = 1024
# reconnect fast once an engine is back (gRPC's default backoff grows to 120 s)
CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
]
FINISH_REASONS = {"stop": FINISH_STOP, "length": FINISH_LENGTH}  # anything else ends the request with an error


class EngineConnectError(OperatorError):
    """The gRPC engine cannot be used (down, unhealthy, another tokenizer); the message names its URL."""


def grpc_target(url: str) -> str:
    """grpc://host:port -> host:port (the form grpc channels take)."""
    parts = urlsplit(url)
    if parts.scheme != "grpc" or not parts.hostname or parts.port is None:
        raise EngineConnectError(f"engine.engine_url must look like grpc://host:port, got {url!r}")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{host}:{parts.port}"


@dataclass
class EngineApi:
    """A connected, checked engine."""

    url: str
    channel: grpc.aio.Channel
    dialect: Dialect
    stub: Any
    vocab_size: int = 0  # GetModelInfo's: the model's output ids (0: not reported)
    served_model_name: str = ""  # GetModelInfo's: the name detok's front serves unless front.model_name is set
    max_context_length: int = 0  # GetModelInfo's: the context length detok's front reports (0: not reported)


def engine_failure(url: str, exc: grpc.aio.AioRpcError) -> str:
    return f"the gRPC engine at {url} failed: {exc.code().name}: {exc.details() or 'no details'}"


async def connect_engine(url: str, service: str, tokenizer: Tokenizer, timeout_s: float) -> EngineApi:
    """Open a channel, find the service, check health and that the engine's ids mean what detok's tokenizer
    says (vocab size; the tokenizer fingerprint where the engine serves GetTokenizer)."""
    channel = grpc.aio.insecure_channel(grpc_target(url), options=CHANNEL_OPTIONS)
    try:
        dialect = await _healthy_dialect(url, channel, service, timeout_s)
        stub = dialect.stub(channel)
        info = await stub.GetModelInfo(dialect.pb2.GetModelInfoRequest(), timeout=timeout_s)
        _check_vocab(url, info.vocab_size, tokenizer)
        await _check_tokenizer_files(url, stub, tokenizer, timeout_s)
    except grpc.aio.AioRpcError as exc:
        await channel.close()
        raise EngineConnectError(engine_failure(url, exc)) from exc
    except BaseException:
        await channel.close()
        raise
    log.info(
        "engine: %s serves %s (model %r at %s, vocab %d)",
        url,
        dialect.service,
        info.served_model_name,
        info.model_path,
        info.vocab_size,
    )
    context = max(0, info.max_context_length)
    return EngineApi(url, channel, dialect, stub, info.vocab_size, info.served_model_name, context)


async def _healthy_dialect(url: str, channel: grpc.aio.Channel, service: str, timeout_s: float) -> Dialect:
    names = AUTO_ORDER if service == "auto" else (service,)
    for name in names:
        dialect = DIALECTS[name]
        stub = dialect.stub(channel)
        try:
            health = await stub.HealthCheck(dialect.pb2.HealthCheckRequest(), timeout=timeout_s, wait_for_ready=True)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED and name != names[-1]:
                continue
            if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise EngineConnectError(
                    f"no gRPC engine answers at {url} (waited {timeout_s:g} s): {exc.details() or exc.code().name}"
                ) from exc
            raise
        if not health.healthy:
            raise EngineConnectError(f"the gRPC engine at {url} is not healthy: {health.message or 'no message'}")
        return dialect
    raise AssertionError("unreachable")


def _check_vocab(url: str, engine_vocab: int, tokenizer: Tokenizer) -> None:
    ours = tokenizer.vocab_size
    if engine_vocab and not ours <= engine_vocab < ours + VOCAB_PADDING_LIMIT:
        raise EngineConnectError(
            f"the gRPC engine at {url} serves another tokenizer: its vocabulary has {engine_vocab} ids, detok's "
            f"tokenizer ({getattr(tokenizer, 'name', '?')}) {ours}; start detok with the engine's tokenizer "
            "(--tokenizer DIR)"
        )


async def _check_tokenizer_files(url: str, stub: Any, tokenizer: Tokenizer, timeout_s: float) -> None:
    """Load the tokenizer the engine ships (GetTokenizer: a zip of its files) and compare fingerprints."""
    from detok_worker.tokenizer import create_tokenizer

    try:
        chunks = [chunk.data async for chunk in stub.GetTokenizer(common_pb2.GetTokenizerRequest(), timeout=timeout_s)]
    except grpc.aio.AioRpcError as exc:
        if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
            raise
        log.info("engine: %s does not serve GetTokenizer; checked the vocabulary size only", url)
        return
    with tempfile.TemporaryDirectory(prefix="detok-engine-tokenizer-") as directory:
        with zipfile.ZipFile(io.BytesIO(b"".join(chunks))) as archive:
            archive.extractall(directory)
        theirs = await asyncio.to_thread(lambda: tokenizer_fingerprint(create_tokenizer(directory)))
    ours = await asyncio.to_thread(tokenizer_fingerprint, tokenizer)
    if theirs != ours:
        raise EngineConnectError(
            f"the gRPC engine at {url} serves another tokenizer (GetTokenizer: fingerprint {theirs}, detok's "
            f"{ours}); start detok with the engine's tokenizer (--tokenizer DIR)"
        )


def new_ids_of_complete(output_ids: list[int], received: int) -> list[int]:
    """The ids a GenerateComplete adds to the `received` streamed ones: engines put either every output id in
    it or none (or only the last chunk's, already streamed)."""
    if received == 0 or len(output_ids) > received:
        return output_ids[received:]
    return []


def output_logprobs(message: Any, skip: int = 0) -> list[TokenLogprob] | None:
    """The bus entries of a chunk's or a GenerateComplete's `output_logprobs` (both dialects share its shape:
    token_logprobs[i] with top_logprobs[i].token_ids / .values), from position `skip` on (a GenerateComplete's are
    cumulative); None when the message has none (the request did not ask, or the engine does not give them)."""
    if not message.HasField("output_logprobs"):
        return None
    output = message.output_logprobs
    values = list(output.token_logprobs)
    tops = output.top_logprobs
    entries = []
    for position in range(skip, len(values)):
        top = tops[position] if position < len(tops) else None
        top_ids = list(top.token_ids) if top is not None else []
        entries.append(TokenLogprob(values[position], top_ids, list(top.values) if top is not None else []))
    return entries or None
