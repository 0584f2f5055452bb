"""Where a tokenizer's chat template comes from, in priority order (as transformers resolves them):

1. an explicit template: a path to a `.jinja` file, a `.json` file (`{"chat_template": str | [{name, template}]}`,
   a bare JSON string, or a list of named templates), or an inline template string;
2. `chat_template.jinja` in the tokenizer directory (plus `additional_chat_templates/*.jinja`, as named templates);
3. `chat_template` in `tokenizer_config.json`: a string, or a list of `{"name", "template"}`;
4. nothing: `load_chat_template` returns None and rendering raises ChatTemplateNotFoundError.

With several named templates, "tool_use" is chosen when tools are given, otherwise "default".
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from detok_worker.tokenizer.chat.template import (
    ChatTemplateError,
    ChatTemplateNotFoundError,
    compile_chat_template,
    render_chat_template,
)
from detok_worker.tokenizer.protocol import TokenizerLoadError

CHAT_TEMPLATE_FILE = "chat_template.jinja"
CHAT_TEMPLATE_DIR = "additional_chat_templates"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
DEFAULT_NAME = "default"
TOOL_USE_NAME = "tool_use"


class ChatTemplateLoadError(ChatTemplateError, TokenizerLoadError):
    """An explicit or configured template source is missing, unreadable or malformed."""


@dataclass(frozen=True)
class ChatTemplates:
    """A tokenizer's chat templates by name (a single template is named "default") and where they came from."""

    templates: Mapping[str, str]
    origin: str

    def select(self, *, tools: Sequence[Any] | None = None, name: str | None = None) -> str:
        """The template transformers would use: `name` if given, "tool_use" when tools are given and it exists,
        else "default"."""
        if name is not None:
            if name not in self.templates:
                raise ChatTemplateNotFoundError(
                    f"no chat template named {name!r} in {self.origin} (available: {sorted(self.templates)})"
                )
            return self.templates[name]
        if tools is not None and TOOL_USE_NAME in self.templates:
            return self.templates[TOOL_USE_NAME]
        if DEFAULT_NAME in self.templates:
            return self.templates[DEFAULT_NAME]
        raise ChatTemplateNotFoundError(
            f"{self.origin} has several chat templates and none is named 'default'; "
            f"pick one by name (available: {sorted(self.templates)})"
        )

    def validate(self) -> None:
        """Compile every template now (ChatTemplateSyntaxError), so a broken one fails at startup, not per request."""
        for template in self.templates.values():
            compile_chat_template(template)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        template_name: str | None = None,
        **kwargs: Any,
    ) -> str:
        """select() then render_chat_template(); kwargs are render_chat_template's. Developer messages are system
        ones for a template without that role, as vLLM's server renders them (developer_as_system)."""
        template = self.select(tools=tools, name=template_name)
        return render_chat_template(template, developer_as_system(messages, template), tools=tools, **kwargs)


def developer_as_system(messages: Sequence[Mapping[str, Any]], template: str) -> Sequence[Mapping[str, Any]]:
    """vLLM's server: where a template never names the developer role (OpenAI's newer name for system), its
    developer messages become system ones (without their own tools), and when a system message is then not only
    the first, all of them merge into one first message (their texts joined by blank lines; a part list's texts
    by newlines), as some templates need the system message first."""
    if '"developer"' in template or "'developer'" in template or all(m.get("role") != "developer" for m in messages):
        return messages
    converted = [
        {**{key: value for key, value in m.items() if key != "tools"}, "role": "system"}
        if m.get("role") == "developer"
        else m
        for m in messages
    ]
    if all(m.get("role") != "system" for m in converted[1:]):
        return converted
    texts = [text for m in converted if m.get("role") == "system" and (text := _system_text(m.get("content")))]
    return [{"role": "system", "content": "\n\n".join(texts)}, *(m for m in converted if m.get("role") != "system")]


def _system_text(content: Any) -> str:
    if isinstance(content, list):
        return "\n".join(
            part if isinstance(part, str) else part["text"]
            for part in content
            if isinstance(part, str) or (isinstance(part, Mapping) and "text" in part)
        )
    return content if isinstance(content, str) else ""


def missing_template_error(tokenizer_name: str) -> ChatTemplateNotFoundError:
    return ChatTemplateNotFoundError(
        f"tokenizer {tokenizer_name!r} has no chat template (looked for an explicit template, {CHAT_TEMPLATE_FILE} "
        f"and 'chat_template' in {TOKENIZER_CONFIG_FILE}); set tokenizer.chat_template to a .jinja/.json file"
    )


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ChatTemplateLoadError(f"cannot read chat template {path}: {exc}") from exc


def _named_templates(value: Any, origin: str) -> dict[str, str]:
    """A `chat_template` value (string or list of {name, template}) -> name -> template."""
    if isinstance(value, str):
        return {DEFAULT_NAME: value}
    if isinstance(value, list) and value:
        templates: dict[str, str] = {}
        for entry in value:
            if not (isinstance(entry, dict) and isinstance(entry.get("name"), str)):
                raise ChatTemplateLoadError(f"{origin}: each named chat template needs a string 'name'")
            if not isinstance(entry.get("template"), str):
                raise ChatTemplateLoadError(f"{origin}: chat template {entry['name']!r} has no string 'template'")
            templates[entry["name"]] = entry["template"]
        return templates
    raise ChatTemplateLoadError(f"{origin}: chat_template must be a string or a list of {{name, template}} objects")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(_read_text(path))
    except json.JSONDecodeError as exc:
        raise ChatTemplateLoadError(f"{path} is not valid JSON: {exc}") from exc


def _from_json_file(path: Path) -> ChatTemplates:
    data = _read_json(path)
    if isinstance(data, dict):
        if "chat_template" not in data:
            raise ChatTemplateLoadError(f"{path} has no 'chat_template' key")
        data = data["chat_template"]
    return ChatTemplates(_named_templates(data, str(path)), str(path))


def _from_explicit(explicit: str | Path) -> ChatTemplates:
    text = str(explicit)
    if isinstance(explicit, str) and ("{{" in text or "{%" in text):
        return ChatTemplates({DEFAULT_NAME: text}, "inline template")
    path = Path(text).expanduser()
    if path.is_dir():
        found = _from_directory(path)
        if found is None:
            raise ChatTemplateLoadError(f"no chat template in directory {path}")
        return found
    if not path.is_file():
        raise ChatTemplateLoadError(f"chat template file not found: {path}")
    if path.suffix == ".json":
        return _from_json_file(path)
    return ChatTemplates({DEFAULT_NAME: _read_text(path)}, str(path))


def _from_directory(directory: Path) -> ChatTemplates | None:
    templates: dict[str, str] = {}
    jinja_file = directory / CHAT_TEMPLATE_FILE
    if jinja_file.is_file():
        templates[DEFAULT_NAME] = _read_text(jinja_file)
    extra_dir = directory / CHAT_TEMPLATE_DIR
    if extra_dir.is_dir():
        for extra in sorted(extra_dir.glob("*.jinja")):
            templates[extra.stem] = _read_text(extra)
    if templates:
        return ChatTemplates(templates, str(jinja_file if DEFAULT_NAME in templates else extra_dir))
    config_file = directory / TOKENIZER_CONFIG_FILE
    if not config_file.is_file():
        return None
    config = _read_json(config_file)
    return templates_from_config(config if isinstance(config, dict) else {}, str(config_file))


def templates_from_config(config: Mapping[str, Any], origin: str) -> ChatTemplates | None:
    """The `chat_template` of a parsed tokenizer_config.json (a string or named templates), or None."""
    value = config.get("chat_template")
    if value is None:
        return None
    return ChatTemplates(_named_templates(value, origin), origin)


def load_chat_template(tokenizer_dir: str | Path | None, explicit: str | Path | None = None) -> ChatTemplates | None:
    """The chat templates for a tokenizer: `explicit` (path or inline template) wins, then the tokenizer directory's
    files. None when the directory has none (a tokenizer without a template is fine until someone renders a chat).
    A tokenizer given as a file (e.g. a tokenizer.json) looks in the file's directory."""
    if explicit:
        return _from_explicit(explicit)
    if tokenizer_dir is None:
        return None
    directory = Path(tokenizer_dir)
    if directory.is_file():
        directory = directory.parent
    if not directory.is_dir():
        return None
    return _from_directory(directory)
