"""Differential test: render_chat_template against transformers' apply_chat_template(tokenize=False), on every
fixture tokenizer's own template and on a harmony-style test template, over a battery of conversations."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from helpers.chat_conversations import CASES, SEARCH_TOOL, USER, WEATHER_TOOL, unpack_tokenizer_dir
from helpers.fixtures import FIXTURE_TOKENIZER_DIRS, REPO

from detok_worker.tokenizer.chat.source import load_chat_template
from detok_worker.tokenizer.chat.template import ChatTemplateError, render_chat_template

transformers = pytest.importorskip("transformers")

HARMONY_LIKE = REPO / "tests" / "fixtures" / "chat_templates" / "harmony_like.jinja"
SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def special_tokens_from_config(directory: Path) -> dict[str, str]:
    """The template variables for special tokens, read straight from tokenizer_config.json."""
    config = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
    result = {}
    for key in SPECIAL_TOKEN_KEYS:
        value = config.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            result[key] = value
    return result


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf_tokenizers")
    return {name: unpack_tokenizer_dir(name, root) for name in FIXTURE_TOKENIZER_DIRS}


_hf_tokenizers: dict[str, Any] = {}


def hf_tokenizer(directory: Path) -> Any:
    key = str(directory)
    if key not in _hf_tokenizers:
        _hf_tokenizers[key] = transformers.AutoTokenizer.from_pretrained(key)
    return _hf_tokenizers[key]


def outcome(render: Any, *args: Any, **kwargs: Any) -> tuple[str, str]:
    """("ok", text) or ("error", "") so that both sides can be compared, failures included: where transformers
    raises (ValueError, TypeError, a jinja2 error), ours must raise a ChatTemplateError."""
    try:
        return "ok", render(*args, **kwargs)
    except ChatTemplateError:
        return "error", ""
    except (ValueError, TypeError, KeyError):
        return "error", ""
    except Exception as exc:
        if type(exc).__module__.startswith("jinja2"):
            return "error", ""
        raise


def assert_same(
    directory: Path, template: str | None, messages: list[dict[str, Any]], options: dict[str, Any], case_id: str = ""
) -> tuple[str, str]:
    tokenizer = hf_tokenizer(directory)
    expected = outcome(tokenizer.apply_chat_template, messages, chat_template=template, tokenize=False, **options)
    source = template if template is not None else load_chat_template(directory).select(tools=options.get("tools"))
    special = special_tokens_from_config(directory)
    actual = outcome(render_chat_template, source, messages, special_tokens=special, **options)
    assert actual == expected, case_id
    return actual


def fixtures_with_templates() -> list[str]:
    return [name for name in sorted(FIXTURE_TOKENIZER_DIRS) if load_chat_template(FIXTURE_TOKENIZER_DIRS[name])]


@pytest.mark.parametrize("name", fixtures_with_templates())
def test_fixture_templates_match_transformers(name: str, hf_dirs: dict[str, Path]) -> None:
    rendered = 0
    for case_id, messages, options in CASES:
        kind, _ = assert_same(hf_dirs[name], None, messages, options, case_id)
        rendered += kind == "ok"
    assert rendered >= len(CASES) // 2  # the battery exercises the template, not only its error paths


def test_known_fixtures_have_templates() -> None:
    assert {"qwen3", "deepseek-v3"} <= set(fixtures_with_templates())
    assert load_chat_template(FIXTURE_TOKENIZER_DIRS["mistral-sp-v1"]) is None


@pytest.mark.parametrize("name", ["gpt-oss", "qwen3"])
def test_harmony_like_template_matches_transformers(name: str, hf_dirs: dict[str, Path]) -> None:
    template = HARMONY_LIKE.read_text(encoding="utf-8")
    oks = 0
    for case_id, messages, options in CASES:
        kind, _ = assert_same(hf_dirs[name], template, messages, options, case_id)
        oks += kind == "ok"
    assert oks >= len(CASES) - 3


def test_qwen3_thinking_switch_changes_output(hf_dirs: dict[str, Path]) -> None:
    template = load_chat_template(hf_dirs["qwen3"]).select()
    off = render_chat_template(template, [USER], add_generation_prompt=True, enable_thinking=False)
    on = render_chat_template(template, [USER], add_generation_prompt=True, enable_thinking=True)
    assert off == on + "<think>\n\n</think>\n\n"


def test_continue_final_message_leaves_message_open(hf_dirs: dict[str, Path]) -> None:
    template = load_chat_template(hf_dirs["qwen3"]).select()
    messages = [USER, {"role": "assistant", "content": "It is"}]
    rendered = render_chat_template(template, messages, continue_final_message=True)
    assert rendered.endswith("It is") and rendered.count("<|im_end|>") == 1  # the assistant turn stays open
    with pytest.raises(ChatTemplateError):
        render_chat_template(template, messages, continue_final_message=True, add_generation_prompt=True)


def test_named_templates_tool_use_selection(hf_dirs: dict[str, Path], tmp_path: Path) -> None:
    directory = tmp_path / "named"
    shutil.copytree(hf_dirs["qwen3"], directory)
    config = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
    default = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
    tool_use = "TOOLS={{ tools | map(attribute='function.name') | join(',') }}\n" + default
    config["chat_template"] = [{"name": "default", "template": default}, {"name": "tool_use", "template": tool_use}]
    (directory / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")

    templates = load_chat_template(directory)
    assert templates.select() == default and templates.select(tools=[WEATHER_TOOL]) == tool_use
    for options in ({}, {"tools": [WEATHER_TOOL, SEARCH_TOOL]}):
        kind, text = assert_same(directory, None, [USER], options)
        assert kind == "ok"
    assert text.startswith("TOOLS=get_weather,search\n")


def test_chat_template_jinja_file_wins_over_config(hf_dirs: dict[str, Path], tmp_path: Path) -> None:
    directory = tmp_path / "jinja_file"
    shutil.copytree(hf_dirs["deepseek-v3"], directory)
    (directory / "chat_template.jinja").write_text("{{ bos_token }}{{ messages[0].content }}|", encoding="utf-8")
    kind, text = assert_same(directory, None, [USER], {})
    assert (kind, text) == ("ok", "<｜begin▁of▁sentence｜>" + USER["content"] + "|")


@pytest.mark.parametrize("name", fixtures_with_templates())
def test_tokenizer_apply_chat_template_matches_transformers(name: str, hf_dirs: dict[str, Path]) -> None:
    """The same battery through our tokenizer's own apply_chat_template (template selection and special-token
    variables come from the backend)."""
    from helpers.fixtures import load_fixture_tokenizer

    ours = load_fixture_tokenizer(name)
    reference = hf_tokenizer(hf_dirs[name])
    for case_id, messages, options in CASES:
        expected = outcome(reference.apply_chat_template, messages, tokenize=False, **options)
        actual = outcome(ours.apply_chat_template, messages, **options)
        assert actual == expected, case_id
