"""Inputs of the encode-cache tests: rendered chat prompts, edge strings, boundary tokens."""

from __future__ import annotations

import random
from functools import cache
from typing import Any

from detok_worker.tokenizer.chat.source import load_chat_template
from detok_worker.tokenizer.chat.template import render_chat_template, special_tokens_template_vars
from detok_worker.tokenizer.protocol import Tokenizer
from helpers.fixtures import FIXTURE_TOKENIZER_DIRS, REPO

HARMONY_LIKE = REPO / "tests" / "fixtures" / "chat_templates" / "harmony_like.jinja"


MISTRAL_V1_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'system' %}{{ '[INST] <<SYS>>\\n' + message['content'] + '\\n<</SYS>> [/INST]' }}"
    "{% else %}{{ ' ' + message['content'] + eos_token }}{% endif %}{% endfor %}"
)
# Fixtures shipped without a template (gpt4o, gpt35turbo, claude): role-prefixed turns, each ended by EOS as text.
ROLE_TURNS_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] + ': ' + message['content'] + eos_token + '\\n' }}{% endfor %}"
)


SYSTEM_PROMPTS = [
    "You are a helpful assistant.",
    "",
    "You are Qwen, a careful reviewer.\nAnswer briefly.\n\n  Keep   whitespace   as is.",
    "你是一个有用的助手。请用中文回答。",
    "Policies:\n" + "\n".join(f"{n}. Refunds within {n * 7} days; be polite 🙂." for n in range(1, 25)),
]


USER_TURNS = [
    "Hi!",
    "What is the capital of France?",
    "Explain quantum mechanics in simple terms, please.",
    "def add(a, b):\n    return a + b\n\nReview this   code.",
    "🎉🎉 party time 👨‍👩‍👧",
    "日本語のテキストと中文混合 text.",
    "   leading and trailing spaces   ",
    "Line one\r\nLine two\n\n\nLine five",
    "Tell me about <tags> and [brackets] and {braces}.",
    "e\u0301 combining marks and ﬁ ligatures and Ａ fullwidth",
    "x" * 300,
    "",
]


ASSISTANT_TURNS = [
    "Sure. Here you go.",
    "Paris.",
    "```python\nprint('hello')\n```",
    "I'd be happy to help!\n\n- point one\n- point two",
    "Bonjour 👋 — ça va?",
    " ",
]


@cache
def chat_template_for(name: str) -> str:
    """The template the tokenizer is served with: its own, else a Hub-style one for its family."""
    templates = load_chat_template(FIXTURE_TOKENIZER_DIRS[name])
    if templates is not None:
        return templates.select()
    if name == "gpt-oss":
        return HARMONY_LIKE.read_text(encoding="utf-8")
    if name == "mistral-sp-v1":
        return MISTRAL_V1_TEMPLATE
    if name in ("gpt4o", "gpt35turbo", "claude"):
        return ROLE_TURNS_TEMPLATE
    raise LookupError(f"no chat template for fixture {name}")


def conversations(count: int = 32, seed: int = 7) -> list[list[dict[str, Any]]]:
    """`count` multi-turn conversations (1 to 6 user turns), some with a system prompt, some empty turns."""
    rng = random.Random(seed)
    result = []
    for index in range(count):
        messages: list[dict[str, Any]] = []
        if index % 4 != 3:
            messages.append({"role": "system", "content": SYSTEM_PROMPTS[index % len(SYSTEM_PROMPTS)]})
        for _ in range(1 + index % 6):
            messages.append({"role": "user", "content": rng.choice(USER_TURNS)})
            messages.append({"role": "assistant", "content": rng.choice(ASSISTANT_TURNS)})
        result.append(messages)
    return result


def render(name: str, tokenizer: Tokenizer, messages: list[dict[str, Any]], *, generation_prompt: bool) -> str:
    return render_chat_template(
        chat_template_for(name),
        messages,
        add_generation_prompt=generation_prompt,
        special_tokens=special_tokens_template_vars(tokenizer.special_tokens),
    )


def chat_prompts(name: str, tokenizer: Tokenizer, count: int = 32) -> list[str]:
    """Every conversation rendered turn by turn, as a chat front sees it: the history so far plus the
    generation prompt after each user turn, and the whole conversation at the end."""
    prompts = []
    for messages in conversations(count):
        for end in range(1, len(messages) + 1):
            if messages[end - 1]["role"] == "user":
                prompts.append(render(name, tokenizer, messages[:end], generation_prompt=True))
        prompts.append(render(name, tokenizer, messages, generation_prompt=False))
    return prompts


def boundary_tokens(tokenizer: Tokenizer) -> list[str]:
    """Special-token strings of the tokenizer, named ones first."""
    special = tokenizer.special_tokens
    named = [special.bos, special.eos, special.unk, special.pad, *special.additional]
    tokens = [token for token in named if token]
    return list(dict.fromkeys(tokens))


def edge_strings(tokenizer: Tokenizer) -> list[str]:
    tokens = boundary_tokens(tokenizer)
    first, second = tokens[0], tokens[1 % len(tokens)]
    return [
        "",
        " ",
        "   \n\t  \n",
        " " * 257,
        "🎉🎉🎉",
        "👨‍👩‍👧‍👦",
        "你好世界，这是一个测试。",
        "مرحبا بالعالم",
        "def f(x):\n\tif x:\n\t\treturn {'a': [1, 2]}\n",
        first,
        first + "hello",
        "hello" + first,
        first + "hello" + second,
        first + first + first,
        first + second + first + second,
        first + " \n" + second + "\n\n",
        first + "\u0301e" + second,
        first + "\r\n" + second + "\r\n",
        first[:-1] + " " + first,  # a near miss, then the token
        "<" + first + ">",
        first + "\x00" + second,
        "system\n" + first + ("word " * 2000) + second + "tail",
        "".join(token + str(index) for index, token in enumerate(tokens * 3)),
        (first + "a") * 600 + second,  # more boundaries than one text caches
    ]
