"""`detok tokenize / detokenize / template`, run as real processes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import mistral_common
import pytest
from helpers.fixtures import REPO

from detok_worker.cli.tokenizer import ToolInputError, parse_ids
from detok_worker.tokenizer import load_default_tokenizer

SP_MODEL = Path(mistral_common.__file__).parent / "data" / "tokenizer.model.v1"


def detok(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "detok_worker.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        check=False,
    )


def test_parse_ids() -> None:
    assert parse_ids("1 2,3\n4") == [1, 2, 3, 4]
    assert parse_ids(" [5, 6] ") == [5, 6]
    for bad in ("1 x", "[1, true]", "[1,"):
        with pytest.raises(ToolInputError):
            parse_ids(bad)


def test_tokenize_json_matches_the_library() -> None:
    text = "Hello 🫨 你好"
    result = detok("tokenize", "--json", text)
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    expected = load_default_tokenizer().encode(text)
    assert record["ids"] == expected.ids
    assert [tuple(span) for span in record["offsets"]] == expected.offsets
    assert record["hash"] == expected.hash()


def test_detokenize_from_stdin_and_errors() -> None:
    result = detok("detokenize", "--tokenizer", str(SP_MODEL), stdin="[1, 6312, 28709, 2]")
    assert (result.returncode, result.stdout) == (0, "<s> hello</s>\n")
    result = detok("detokenize", "--tokenizer", str(SP_MODEL), "--skip-special-tokens", "1,6312", "28709")
    assert (result.returncode, result.stdout) == (0, "hello\n")
    result = detok("detokenize", "--tokenizer", str(SP_MODEL), "32000")
    assert result.returncode == 1 and "32000" in result.stderr and "Traceback" not in result.stderr


def test_template_renders_and_tokenizes(tmp_path: Path) -> None:
    messages = tmp_path / "messages.json"
    messages.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}))
    result = detok(
        "template", str(messages), "--add-generation-prompt", "--kwargs", '{"enable_thinking": false}', "--tokenize"
    )
    assert result.returncode == 0, result.stderr
    tokenizer = load_default_tokenizer()
    expected = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, enable_thinking=False
    )
    ids = " ".join(map(str, tokenizer.encode(expected).ids))
    assert result.stdout == expected + ("" if expected.endswith("\n") else "\n") + ids + "\n"
    missing = detok("template", "--tokenizer", str(SP_MODEL), str(messages))
    assert missing.returncode == 1 and "chat template" in missing.stderr
