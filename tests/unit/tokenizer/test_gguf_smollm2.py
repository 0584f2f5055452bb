"""detok's tokenizer loaded from SmolLM2-135M-Instruct's GGUF (pre-tokenizer 'smollm') against llama.cpp on the
same file: the same ids for every text, the same full decode for every id sequence (texts, random ids, the model's
own greedy output), the same chat prompts as llama.cpp renders and tokenizes them."""

from __future__ import annotations

import json
import random

import gguf
import pytest
from helpers.llama_oracle import greedy_ids, llama_chat_prompt, llama_detokenize, smollm2
from helpers.texts import load_texts
from helpers.tokenizer_files import MULTILINGUAL_TEXTS

from detok_worker.config import load_config
from detok_worker.front.prompts import chat_prompt_ids
from detok_worker.front.validation import Limits, decode_chat
from detok_worker.tokenizer import create_tokenizer
from detok_worker.tokenizer.backends.gguf import read_metadata
from engine_stub.llama import default_model_path

EXTRA_TEXTS = [
    "12345 1,234.5 3.14159 ٣٤٥ ½ x² 10⁶",
    "don't I'll we've they're O'Neil's",
    "a\t\tb  \n\n  c   \r\n\r\n",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|><|im_end|>text<repo_name>",
    "🫨🫨 👩‍👩‍👧 🇯🇵 ‼️",
    "for (int i = 0; i < n; ++i) { sum += a[i] * 2; }  // C\n",
]
CONVERSATIONS = [
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name three primes."}],
    [
        {"role": "system", "content": "Answer in one line. 你好 👋"},
        {"role": "user", "content": "What is 12 * 34?"},
        {"role": "assistant", "content": "408."},
        {"role": "user", "content": "And 56 + 78?"},
    ],
    [{"role": "system", "content": ""}, {"role": "user", "content": "def f(x):\n\treturn x  # why?"}],
    [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Translate 'good morning' into Chinese, Japanese and Korean."},
    ],
]
# Without a system message the model's template adds its own (llama.cpp's built-in rendering does not).
EMOJI_REPLY = [{"role": "user", "content": "Reply with three emoji about cats."}]  # 40 ids end inside an emoji


@pytest.fixture(scope="module")
def tokenizer():
    return create_tokenizer(str(default_model_path()))


def _texts() -> list[str]:
    return [*MULTILINGUAL_TEXTS, *load_texts().values(), *EXTRA_TEXTS]


def test_the_built_in_reader_agrees_with_gguf_reader_on_the_model_file() -> None:
    path = default_model_path()
    ours = read_metadata(path)
    fields = gguf.GGUFReader(str(path)).fields
    theirs = {name: field.contents() for name, field in fields.items() if name.startswith("tokenizer.")}
    assert ours == theirs
    assert ours["tokenizer.ggml.pre"] == "smollm"


def test_encode_gives_llama_cpp_ids(tokenizer) -> None:
    llama = smollm2()
    for text in _texts():
        assert tokenizer.encode(text).ids == llama.tokenize(text), text
    assert tokenizer.vocab_size == llama.n_vocab


def test_decode_gives_llama_cpp_text_for_texts_and_random_ids(tokenizer) -> None:
    sequences = list(map(smollm2().tokenize, _texts()))
    rng = random.Random(7)
    for _ in range(300):  # biased to the byte-level pieces that hold parts of characters
        sequences.append([rng.choice((rng.randrange(17, 300), rng.randrange(49152))) for _ in range(rng.randint(1, 9))])
    for ids in sequences:
        for skip in (False, True):
            assert tokenizer.decode(ids, skip_special_tokens=skip) == llama_detokenize(ids, special=not skip), ids


def test_decode_gives_llama_cpp_text_for_the_models_own_output(tokenizer) -> None:
    for messages in [*CONVERSATIONS, EMOJI_REPLY]:
        prompt = tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True)).ids
        generated = greedy_ids(prompt, 40)
        assert generated
        for skip in (False, True):
            assert tokenizer.decode(generated, skip_special_tokens=skip) == llama_detokenize(generated, not skip)


def test_front_chat_prompts_are_llama_cpp_renderings_and_ids(tokenizer) -> None:
    llama = smollm2()
    limits = Limits.from_config(load_config(), "m", tokenizer)
    for messages in CONVERSATIONS:
        request = decode_chat(json.dumps({"model": "m", "messages": messages}).encode())
        rendered = llama_chat_prompt(messages)
        assert tokenizer.apply_chat_template(messages, add_generation_prompt=True) == rendered
        assert chat_prompt_ids(request, tokenizer, limits) == llama.tokenize(rendered)
