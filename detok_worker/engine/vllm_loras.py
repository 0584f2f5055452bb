"""The LoRA adapters of the vLLM source's engine core, by the name requests give: vLLM's `--lora-modules` loaded at
start, and (with VLLM_ALLOW_RUNTIME_LORA_UPDATING) the ones the fronts' /v1/load_lora_adapter and
/v1/unload_lora_adapter ask for at run time, answered as vLLM's server answers them (its OpenAIServingModels):
numbered in loading order, a known name refused unless loaded in place (which keeps its number), an unloaded
adapter only forgotten (the engine core keeps it cached; requests already on it run on). The engine owns this table
for every front: they serve its names as models (EngineStats.lora_adapters). Imported only by the vLLM source.
"""

from __future__ import annotations

import asyncio
import logging

from vllm.entrypoints.openai.models.protocol import LoRAModulePath
from vllm.exceptions import LoRAAdapterNotFoundError
from vllm.lora.request import LoRARequest
from vllm.v1.engine.core_client import EngineCoreClient

from detok_worker.bus.messages import AdapterAnswer, AdapterCall

log = logging.getLogger(__name__)


class LoraAdapters:
    def __init__(self, client: EngineCoreClient, served_names: list[str]) -> None:
        """`served_names`: the base model's names (--served-model-name): no adapter may take one."""
        self.client = client
        self.served_names = frozenset(served_names)
        self.requests: dict[str, LoRARequest] = {}  # what RequestBuilder gives the engine core for each name
        self._numbers = 0
        self._calls = asyncio.Lock()  # one load or unload at a time: each sees the table the previous one left

    def paths(self) -> dict[str, str]:
        return {name: lora.lora_path for name, lora in self.requests.items()}

    async def load_static(self, modules: list[LoRAModulePath] | None) -> None:
        """vLLM's --lora-modules, in order; an adapter the engine cannot load fails the start."""
        for module in modules or []:
            lora = self._numbered(module.name, module.path, module.is_3d_lora_weight)
            lora.base_model_name = module.base_model_name
            await self.client.add_lora_async(lora)
            self.requests[module.name] = lora

    async def call(self, call: AdapterCall) -> AdapterAnswer:
        async with self._calls:
            status, message = await (self._load(call) if call.path else self._unload(call))
        return AdapterAnswer(call.call, status, message, self.paths())

    async def _load(self, call: AdapterCall) -> tuple[int, str]:
        name, path = call.name, call.path
        if name in self.served_names:
            return 400, f"The lora adapter '{name}' conflicts with a served base model."
        known = self.requests.get(name)
        if known is not None and not call.load_inplace:
            return 400, (
                f"The lora adapter '{name}' has already been loaded. If you want to load the adapter in place, "
                "set 'load_inplace' to True."
            )
        if known is not None:
            lora = LoRARequest(name, known.lora_int_id, path, load_inplace=True, is_3d_lora_weight=call.is_3d)
        else:
            lora = self._numbered(name, path, call.is_3d)
        try:
            await self.client.add_lora_async(lora)
        except Exception as exc:  # noqa: BLE001 - the engine core's failure, for the caller to read
            # the engine core returns a failure as text only: vLLM's server, too, tells "no adapter there" by it
            not_found = str(LoRAAdapterNotFoundError(name, path))
            if not_found in str(exc):
                return 404, not_found
            return 500, str(exc)
        self.requests[name] = lora
        log.info("engine: loaded LoRA adapter %r from %s", name, path)
        return 200, f"Success: LoRA adapter '{name}' added successfully."

    async def _unload(self, call: AdapterCall) -> tuple[int, str]:
        name = call.name
        if self.requests.pop(name, None) is None:
            return 404, f"The lora adapter '{name}' cannot be found."
        log.info("engine: removed LoRA adapter %r", name)
        return 200, f"Success: LoRA adapter '{name}' removed successfully."

    def _numbered(self, name: str, path: str, is_3d: bool) -> LoRARequest:
        """A new adapter's request, with the next number (vLLM's lora_int_id, from 1, never reused)."""
        self._numbers += 1
        return LoRARequest(name, self._numbers, path, is_3d_lora_weight=is_3d)
