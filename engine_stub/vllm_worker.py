"""A model-free vLLM worker: vLLM's real engine core, scheduler, KV-cache accounting and wire, with the forward pass
replaced by seeded ids and a fixed step time, so a front end can be measured at GPU token rates on CPU.

Select it with vLLM's own flag, the same for `vllm serve` and `detok serve --source vllm`:

    --worker-cls engine_stub.vllm_worker.ModelFreeWorker     (engine_stub importable: PYTHONPATH=<detok checkout>)

It loads the model as the CPU worker does (use a small config with `--load-format dummy`: the weights are never
used, only the attention layers that size the KV cache), skips the warm-up, and then runs no model at all. Each
step every scheduled request that has all of its tokens computed gets one id, drawn from the tokenizer's own
vocabulary without its added tokens (byte pieces, multi-byte UTF-8 fragments, CJK; never EOS or a special token, so
requests end by max_tokens, stop strings or stop ids) by a generator seeded with the request's `seed`, or with its
prompt ids when it has none: the same request gives the same ids on every server and every start. A request still
in its prefill gets none, as from a real model. A step's output is released one step time after the previous
one's (the scheduler's own time overlaps it, as with a GPU and async scheduling), or at once when it is late.

Environment (read in the engine core process, which inherits the server's environment):
  DETOK_MODEL_FREE_STEP_MS  the time of one engine step whatever its batch (default 15: a GPU decode step);
                            0 runs unpaced, as fast as vLLM's scheduler goes.

What it does not produce: logprobs and prompt logprobs (the engine's outputs carry none), pooling outputs,
speculative tokens. A structured-output grammar is not applied to the drawn ids.
"""

from __future__ import annotations

import os
import random
import time
import zlib
from array import array
from pathlib import Path

from vllm.logger import init_logger
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.worker.cpu_worker import CPUWorker
from vllm.v1.worker.worker_base import CompilationTimes

log = init_logger(__name__)

STEP_MS_ENV = "DETOK_MODEL_FREE_STEP_MS"
DEFAULT_STEP_MS = 15.0


class _Sequence:
    """One request's generation: the ids it still needs computed, and its id generator."""

    __slots__ = ("length", "rng")

    def __init__(self, prompt_ids: list[int], seed: int | None) -> None:
        self.length = len(prompt_ids)  # prompt + generated ids so far
        if seed is None:
            seed = zlib.crc32(array("q", prompt_ids).tobytes())
        self.rng = random.Random(seed)


def base_vocab_size(model_dir: str, config_vocab_size: int) -> int:
    """The tokenizer's vocabulary without its added tokens (the ids drawn); the model's size if it has no
    tokenizer.json to read."""
    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        return config_vocab_size
    from tokenizers import Tokenizer

    return min(Tokenizer.from_file(str(path)).get_vocab_size(with_added_tokens=False), config_vocab_size)


class ModelFreeWorker(CPUWorker):
    """vLLM's CPU worker without the model run: see the module docstring."""

    def load_model(self, *, load_dummy_weights: bool = False) -> None:
        super().load_model(load_dummy_weights=load_dummy_weights)
        self.step_s = float(os.environ.get(STEP_MS_ENV, DEFAULT_STEP_MS)) / 1000.0
        if self.step_s < 0:
            raise ValueError(f"{STEP_MS_ENV} must be >= 0, got {self.step_s * 1000}")
        model_config = self.vllm_config.model_config
        self.draw_size = base_vocab_size(model_config.tokenizer, model_config.get_vocab_size())
        self.sequences: dict[str, _Sequence] = {}
        self.last_release = 0.0
        log.info("model-free worker: ids from %d vocabulary entries, %.1f ms per step", self.draw_size, self.step_s)

    def _should_warm_up_model(self) -> bool:
        return False  # no model runs, so nothing to warm up

    def compile_or_warm_up_model(self) -> CompilationTimes:
        return CompilationTimes(language_model=0.0, encoder=0.0)

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        sequences = self.sequences
        for rid in scheduler_output.finished_req_ids:
            sequences.pop(rid, None)
        cached = scheduler_output.scheduled_cached_reqs
        computed = dict(zip(cached.req_ids, cached.num_computed_tokens, strict=True))
        for new in scheduler_output.scheduled_new_reqs:
            params = new.sampling_params
            sequences[new.req_id] = _Sequence(new.prompt_token_ids or [], params.seed if params else None)
            computed[new.req_id] = new.num_computed_tokens
        req_ids: list[str] = []
        sampled: list[list[int]] = []
        vocab = self.draw_size
        for rid, scheduled in scheduler_output.num_scheduled_tokens.items():
            sequence = sequences[rid]
            req_ids.append(rid)
            if computed[rid] + scheduled < sequence.length:
                sampled.append([])  # a prefill that goes on next step
                continue
            sequence.length += 1
            sampled.append([sequence.rng.randrange(vocab)])
        output = ModelRunnerOutput(
            req_ids=req_ids, req_id_to_index={rid: i for i, rid in enumerate(req_ids)}, sampled_token_ids=sampled
        )
        now = time.perf_counter()
        release_at = self.last_release + self.step_s
        if release_at > now:
            time.sleep(release_at - now)
        self.last_release = max(now, release_at)
        return output
