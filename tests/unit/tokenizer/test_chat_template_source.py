"""Chat template sources (priority and formats), the sandbox, and typed errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.fixtures import FIXTURE_TOKENIZER_DIRS

from detok_worker.tokenizer.chat.source import (
    ChatTemplateLoadError,
    ChatTemplateNotFoundError,
    ChatTemplates,
    load_chat_template,
    missing_template_error,
)
from detok_worker.tokenizer.chat.template import (
    ChatTemplateError,
    ChatTemplateInputError,
    ChatTemplateRenderError,
    ChatTemplateSecurityError,
    ChatTemplateSyntaxError,
    render_chat_template,
    special_tokens_template_vars,
)
from detok_worker.tokenizer.protocol import SpecialTokens, TokenizerError, TokenizerLoadError

HELLO = [{"role": "user", "content": "hello"}]
ECHO = "{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}"


def write_config(directory: Path, chat_template: object | None) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    config: dict[str, object] = {"eos_token": "</s>"}
    if chat_template is not None:
        config["chat_template"] = chat_template
    (directory / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")


def rendered(templates: ChatTemplates | None, **select: object) -> str:
    assert templates is not None
    return render_chat_template(templates.select(**select), HELLO)


# ---- sources --------------------------------------------------------------------------------------------


def test_priority_explicit_then_jinja_file_then_config(tmp_path: Path) -> None:
    write_config(tmp_path, "config:{{ messages[0].content }}")
    assert rendered(load_chat_template(tmp_path)) == "config:hello"
    (tmp_path / "chat_template.jinja").write_text("jinja:{{ messages[0].content }}", encoding="utf-8")
    assert rendered(load_chat_template(tmp_path)) == "jinja:hello"
    explicit = tmp_path / "mine.jinja"
    explicit.write_text("explicit:{{ messages[0].content }}", encoding="utf-8")
    assert rendered(load_chat_template(tmp_path, explicit=explicit)) == "explicit:hello"
    assert rendered(load_chat_template(tmp_path, explicit=str(explicit))) == "explicit:hello"


def test_tokenizer_file_path_looks_in_its_directory(tmp_path: Path) -> None:
    write_config(tmp_path, ECHO)
    (tmp_path / "tokenizer.json").write_text("{}", encoding="utf-8")
    assert rendered(load_chat_template(tmp_path / "tokenizer.json")) == "user:hello;"


@pytest.mark.parametrize(
    "content",
    [
        {"chat_template": ECHO},
        ECHO,
        {"chat_template": [{"name": "default", "template": ECHO}]},
        [{"name": "default", "template": ECHO}, {"name": "tool_use", "template": "tools!"}],
    ],
)
def test_explicit_json_forms(tmp_path: Path, content: object) -> None:
    path = tmp_path / "chat_template.json"
    path.write_text(json.dumps(content), encoding="utf-8")
    assert rendered(load_chat_template(None, explicit=path)) == "user:hello;"


def test_inline_template_string() -> None:
    templates = load_chat_template(FIXTURE_TOKENIZER_DIRS["qwen3"], explicit=ECHO)
    assert templates is not None and templates.origin == "inline template"
    assert rendered(templates) == "user:hello;"


def test_named_templates_selection(tmp_path: Path) -> None:
    write_config(tmp_path, [{"name": "default", "template": "D"}, {"name": "tool_use", "template": "T"}])
    templates = load_chat_template(tmp_path)
    assert templates is not None
    assert templates.select() == "D"
    assert templates.select(tools=[{"type": "function"}]) == "T"
    assert templates.select(tools=[]) == "T"  # like transformers: any tools argument, even empty
    assert templates.select(name="tool_use") == "T"
    with pytest.raises(ChatTemplateNotFoundError):
        templates.select(name="rag")


def test_named_templates_without_default(tmp_path: Path) -> None:
    write_config(tmp_path, [{"name": "tool_use", "template": "T"}, {"name": "rag", "template": "R"}])
    templates = load_chat_template(tmp_path)
    assert templates is not None
    assert templates.select(tools=[{}]) == "T"
    with pytest.raises(ChatTemplateNotFoundError, match="rag"):
        templates.select()


def test_additional_chat_templates_directory(tmp_path: Path) -> None:
    (tmp_path / "chat_template.jinja").write_text("D", encoding="utf-8")
    (tmp_path / "additional_chat_templates").mkdir()
    (tmp_path / "additional_chat_templates" / "tool_use.jinja").write_text("T", encoding="utf-8")
    templates = load_chat_template(tmp_path)
    assert templates is not None and dict(templates.templates) == {"default": "D", "tool_use": "T"}


def test_no_template_is_none_and_rendering_needs_one(tmp_path: Path) -> None:
    write_config(tmp_path, None)
    assert load_chat_template(tmp_path) is None
    assert load_chat_template(tmp_path / "missing") is None
    assert load_chat_template(FIXTURE_TOKENIZER_DIRS["mistral-sp-v1"]) is None
    error = missing_template_error("mistral-sp-v1")
    assert isinstance(error, ChatTemplateNotFoundError) and isinstance(error, TokenizerError)


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("missing.jinja", None),
        ("bad.json", "{not json"),
        ("nokey.json", json.dumps({"eos_token": "x"})),
        ("badlist.json", json.dumps({"chat_template": [{"name": 1, "template": "x"}]})),
        ("notemplate.json", json.dumps({"chat_template": [{"name": "default"}]})),
        ("number.json", json.dumps({"chat_template": 5})),
    ],
)
def test_bad_explicit_sources_raise_load_errors(tmp_path: Path, name: str, content: str | None) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(ChatTemplateLoadError) as info:
        load_chat_template(None, explicit=path)
    assert isinstance(info.value, TokenizerLoadError)


def test_invalid_utf8_template_file(tmp_path: Path) -> None:
    path = tmp_path / "latin1.jinja"
    path.write_bytes(b"caf\xe9 {{ messages }}")
    with pytest.raises(ChatTemplateLoadError):
        load_chat_template(None, explicit=path)


def test_validate_reports_syntax_errors_up_front() -> None:
    templates = ChatTemplates({"default": "{% for m in messages %}", "tool_use": ECHO}, "test")
    with pytest.raises(ChatTemplateSyntaxError):
        templates.validate()
    ChatTemplates({"default": ECHO}, "test").validate()


# ---- sandbox --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "template",
    [
        "{{ ''.__class__.__mro__ }}",
        "{{ ''.__class__ }}",
        "{{ messages.__class__.__base__.__subclasses__() }}",
        "{{ cycler.__init__.__globals__ }}",
        "{{ raise_exception.__globals__ }}",
        "{{ namespace.__init__ }}",
        "{% set ns = namespace(_private=1) %}x",
        "{% set ns = namespace() %}{% set ns._x = 1 %}x",
        "{{ messages.append({'role': 'x'}) }}",
        "{{ messages[0].update({'content': 'x'}) }}",
        "{{ dict.__call__.__globals__ }}",
        "{{ self._TemplateReference__context }}",
        "{{ lipsum.__globals__['os'].system('touch /tmp/detok-pwned') }}",
    ],
)
def test_sandbox_blocks_python_internals(template: str) -> None:
    with pytest.raises(ChatTemplateSecurityError):
        render_chat_template(template, HELLO)
    assert not Path("/tmp/detok-pwned").exists()


def test_raise_exception_is_a_render_error_with_the_message() -> None:
    template = "{% if messages[0].role != 'system' %}{{ raise_exception('first message must be system') }}{% endif %}"
    with pytest.raises(ChatTemplateRenderError, match="first message must be system") as info:
        render_chat_template(template, HELLO)
    assert not isinstance(info.value, ChatTemplateSecurityError)


def test_template_runtime_failure_is_typed() -> None:
    with pytest.raises(ChatTemplateRenderError):
        render_chat_template("{{ messages[0].content + 1 }}", HELLO)
    with pytest.raises(ChatTemplateSyntaxError):
        render_chat_template("{% if %}", HELLO)


@pytest.mark.parametrize(
    ("messages", "options"),
    [
        ([], {}),
        ("hello", {}),
        (["hello"], {}),
        ([{"role": "user", "content": "x"}], {"tools": "not a list"}),
        ([{"role": "user", "content": "x"}], {"documents": [1, 2]}),
        ([{"role": "user", "content": "x"}], {"continue_final_message": True, "add_generation_prompt": True}),
        ([{"role": "user"}], {"continue_final_message": True}),
    ],
)
def test_bad_arguments_raise_input_errors(messages: object, options: dict[str, object]) -> None:
    with pytest.raises(ChatTemplateInputError) as info:
        render_chat_template(ECHO, messages, **options)  # type: ignore[arg-type]
    assert isinstance(info.value, ChatTemplateError) and isinstance(info.value, ValueError)


def test_template_helpers_and_filters() -> None:
    template = (
        "{{ {'b': 1, 'a': '<é>'} | tojson }}|{{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }}|"
        "{{ dict(x=1) | tojson }}|{{ dict.fromkeys(['k'], 0) | tojson }}|"
        "{% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}{% break %}{% endif %}{{ i }}"
        "{% endfor %}|{% generation %}gen{% endgeneration %}|{{ strftime_now('%Y') | length }}"
    )
    assert render_chat_template(template, HELLO) == '{"b": 1, "a": "<é>"}|{"a": 2, "b": 1}|{"x": 1}|{"k": 0}|02|gen|4'


def test_rich_objects_reach_the_template_as_placeholders() -> None:
    class Secret:
        def delete_everything(self) -> None:
            raise AssertionError("must never be callable from a template")

    template = "{{ messages[0].content }}|{{ blob }}|{{ messages[0].extra }}"
    messages = [{"role": "user", "content": "x", "extra": ("a", 1)}]
    assert render_chat_template(template, messages, blob=Secret()) == "x|<Secret>|('a', 1)"


def test_special_tokens_become_template_variables() -> None:
    special = SpecialTokens(bos="<s>", eos="</s>", unk=None, additional=("<x>",))
    variables = special_tokens_template_vars(special, {"image_token": "<img>"})
    assert variables == {"bos_token": "<s>", "eos_token": "</s>", "image_token": "<img>"}
    template = "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}"
    assert render_chat_template(template, HELLO, special_tokens=variables) == "<s>hello</s>"
    assert render_chat_template(template, HELLO, special_tokens=variables, eos_token="!") == "<s>hello!"


# a template that prints every message, and one that also knows the developer role (names it in a test)
ROLES_ECHO = "{% for m in messages %}[{{ m.role }}|{{ m.content }}|{{ m.name or '' }}]{% endfor %}"
WITH_DEVELOPER = ROLES_ECHO + "{% if false %}{{ 'developer' }}{% endif %}"


def test_developer_messages_are_system_ones_where_the_template_has_no_developer_role() -> None:
    """vLLM's server: developer -> system; a system message then not only the first: all merged into the first."""
    only = [{"role": "developer", "content": "brief", "name": "ops", "tools": [{"x": 1}]}, *HELLO]
    assert ChatTemplates({"default": ROLES_ECHO}, "t").render(only) == "[system|brief|ops][user|hello|]"
    mixed = [
        {"role": "system", "content": "S1"},
        *HELLO,
        {"role": "developer", "content": [{"type": "text", "text": "D"}, {"type": "text", "text": "2"}]},
        {"role": "system", "content": ""},
        {"role": "user", "content": "again"},
    ]
    merged = ChatTemplates({"default": ROLES_ECHO}, "t").render(mixed)
    assert merged == "[system|S1\n\nD\n2|][user|hello|][user|again|]"
    kept = ChatTemplates({"default": WITH_DEVELOPER}, "t").render(mixed)
    assert kept.startswith("[system|S1|][user|hello|][developer|")
    no_developer = [{"role": "user", "content": "a"}, {"role": "system", "content": "late"}]
    assert ChatTemplates({"default": ROLES_ECHO}, "t").render(no_developer) == "[user|a|][system|late|]"
