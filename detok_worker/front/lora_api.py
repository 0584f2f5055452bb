"""POST /v1/load_lora_adapter and /v1/unload_lora_adapter (front.runtime_lora_updating: vLLM's server with
VLLM_ALLOW_RUNTIME_LORA_UPDATING): the body checked here, the call made by the engine, which owns the adapter
table (engine/vllm_loras.py) and answers as vLLM's server does: a plain-text "Success: ..." or an error. Every
front serves the engine's table as models (Dispatcher.lora_adapters).
"""

from __future__ import annotations

import uuid

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from detok_worker.bus.messages import AdapterCall
from detok_worker.front.dispatch import Dispatcher
from detok_worker.front.errors import NOT_FOUND, SERVER_ERROR, APIError, bad_request
from detok_worker.front.request_intake import RequestIntake
from detok_worker.front.validation import decode_json


class LoadLoraAdapterRequest(msgspec.Struct):
    lora_name: str
    lora_path: str
    load_inplace: bool = False
    is_3d_lora_weight: bool = False


class UnloadLoraAdapterRequest(msgspec.Struct):
    lora_name: str
    lora_int_id: int | None = None  # vLLM's field; unloading goes by the name


_load_decoder = msgspec.json.Decoder(LoadLoraAdapterRequest)
_unload_decoder = msgspec.json.Decoder(UnloadLoraAdapterRequest)
ANSWER_TYPES = {400: "invalid_request_error", 404: NOT_FOUND}


class LoraAdapterRoutes:
    def __init__(self, dispatcher: Dispatcher, intake: RequestIntake) -> None:
        self.dispatcher = dispatcher
        self.intake = intake

    async def load(self, request: Request) -> Response:
        self.intake.authorize(request)
        body: LoadLoraAdapterRequest = decode_json(_load_decoder, await self.intake.read_body(request))
        if not body.lora_name or not body.lora_path:
            raise bad_request("Both 'lora_name' and 'lora_path' must be provided.")
        call = AdapterCall(
            self._call_id(), self.dispatcher.index, body.lora_name, body.lora_path, body.load_inplace,
            body.is_3d_lora_weight,
        )  # fmt: skip
        return await self._answer(call)

    async def unload(self, request: Request) -> Response:
        self.intake.authorize(request)
        body: UnloadLoraAdapterRequest = decode_json(_unload_decoder, await self.intake.read_body(request))
        if not body.lora_name:
            raise bad_request("'lora_name' needs to be provided to unload a LoRA adapter.")
        return await self._answer(AdapterCall(self._call_id(), self.dispatcher.index, body.lora_name))

    async def _answer(self, call: AdapterCall) -> Response:
        answer = await self.dispatcher.call_adapter(call)
        if answer.status != 200:
            raise APIError(answer.status, answer.message, type=ANSWER_TYPES.get(answer.status, SERVER_ERROR))
        return Response(answer.message)

    @staticmethod
    def _call_id() -> str:
        return uuid.uuid4().hex
