"""The two services of the token-only gRPC engine API (SMG's protocol, PyPI `smg-grpc-proto`), one class each:
`VllmEngine` (`vllm serve --grpc`) and `SglangScheduler` (`sglang serve --grpc-mode`). Same shape; they differ in
the limit fields (max_tokens/min_tokens vs max_new_tokens/min_new_tokens), in what their SamplingParams carry
(grpc_sampling.py) and in Abort (a list of request ids vs one)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import ModuleType
from typing import Any, ClassVar

import grpc
from smg_grpc_proto import sglang_scheduler_pb2, sglang_scheduler_pb2_grpc, vllm_engine_pb2, vllm_engine_pb2_grpc

from detok_worker.bus.messages import DetokParams, RequestParams, SamplingParams
from detok_worker.config.schema import EngineService
from detok_worker.engine.grpc_sampling import (
    refuse_engine_fields,
    sglang_request_fields,
    sglang_sampling_fields,
    vllm_sampling_fields,
)


class Dialect(ABC):
    """What the gateway asks of a service: its messages (`pb2`, generated protobuf code), a stub on a channel, a
    GenerateRequest and an AbortRequest."""

    name: ClassVar[EngineService]  # its engine.engine_service value
    service: ClassVar[str]  # the gRPC service name
    pb2: ClassVar[ModuleType]

    @abstractmethod
    def stub(self, channel: grpc.aio.Channel) -> Any:
        """The service's client stub (generated code: its RPCs are untyped)."""

    @abstractmethod
    def abort_request(self, rid: str) -> Any: ...

    @abstractmethod
    def _limits(self, params: RequestParams, detok: DetokParams) -> dict[str, int]:
        """max_tokens and min_tokens under the service's field names."""

    @abstractmethod
    def _sampling_fields(self, sampling: SamplingParams) -> dict[str, Any]: ...

    def _request_fields(self, sampling: SamplingParams) -> dict[str, Any]:
        """Fields of the GenerateRequest itself beyond the prompt and the sampling parameters."""
        return {}

    def generate_request(self, rid: str, prompt_ids: list[int], params: RequestParams, detok: DetokParams) -> Any:
        """Prompt ids in, ids out: stop *strings* stay with detok's workers; stop ids (EOS included as detok
        applies it: unless ignore_eos) go to the engine so it stops generating there; the sampling parameters and
        the constraint go as the client gave them (grpc_sampling.py; ParameterError when they cannot)."""
        pb2 = self.pb2
        refuse_engine_fields(params)
        sampling = pb2.SamplingParams(
            stop_token_ids=detok.stop_token_ids,
            ignore_eos=params.ignore_eos,
            skip_special_tokens=False,
            **self._limits(params, detok),
            **self._sampling_fields(params.sampling),
        )
        return pb2.GenerateRequest(
            request_id=rid,
            tokenized=pb2.TokenizedInput(input_ids=prompt_ids),
            sampling_params=sampling,
            stream=True,
            **self._request_fields(params.sampling),
        )


class VllmDialect(Dialect):
    name = "vllm"
    service = "VllmEngine"
    pb2 = vllm_engine_pb2

    def stub(self, channel: grpc.aio.Channel) -> Any:
        return vllm_engine_pb2_grpc.VllmEngineStub(channel)

    def abort_request(self, rid: str) -> Any:
        return self.pb2.AbortRequest(request_ids=[rid])

    def _limits(self, params: RequestParams, detok: DetokParams) -> dict[str, int]:
        return {"max_tokens": params.max_tokens, "min_tokens": detok.min_tokens}

    def _sampling_fields(self, sampling: SamplingParams) -> dict[str, Any]:
        return vllm_sampling_fields(sampling)


class SglangDialect(Dialect):
    name = "sglang"
    service = "SglangScheduler"
    pb2 = sglang_scheduler_pb2

    def stub(self, channel: grpc.aio.Channel) -> Any:
        return sglang_scheduler_pb2_grpc.SglangSchedulerStub(channel)

    def abort_request(self, rid: str) -> Any:
        return self.pb2.AbortRequest(request_id=rid, reason="detok: stopped")

    def _limits(self, params: RequestParams, detok: DetokParams) -> dict[str, int]:
        return {"max_new_tokens": params.max_tokens, "min_new_tokens": detok.min_tokens}

    def _sampling_fields(self, sampling: SamplingParams) -> dict[str, Any]:
        return sglang_sampling_fields(sampling)

    def _request_fields(self, sampling: SamplingParams) -> dict[str, Any]:
        return sglang_request_fields(sampling)


DIALECTS: dict[str, Dialect] = {dialect.name: dialect for dialect in (VllmDialect(), SglangDialect())}
AUTO_ORDER = ("vllm", "sglang")  # engine.engine_service = "auto": the services asked, in this order
