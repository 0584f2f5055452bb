"""Chat templates: jinja2 rendering with output byte-identical to transformers' `apply_chat_template(tokenize=False)`.

Same environment as transformers (ImmutableSandboxedEnvironment with trim_blocks/lstrip_blocks, the loop-controls
extension, a pass-through `{% generation %}` tag, `raise_exception`, `strftime_now`, a `tojson` that does not
HTML-escape, a restricted `dict` and an underscore-rejecting `namespace`) and the same input handling (None-valued
message keys dropped, inputs rebuilt from plain JSON types, reasoning fields aliased, `continue_final_message`).

One deliberate difference: touching an unsafe attribute (`''.__class__`) raises ChatTemplateSecurityError at once;
jinja's sandbox would render it as an empty string as long as nothing further is done with it.

Where templates come from is `load_chat_template`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.exceptions import SecurityError, TemplateError, TemplateSyntaxError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from detok_worker.tokenizer.protocol import SpecialTokens, TokenizerError

# Older jinja2 releases have known sandbox escapes; chat templates from the Hub are untrusted code.
_MIN_JINJA2 = (3, 1, 6)

# transformers appends this marker to the message being continued, renders, then cuts the output at it.
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
# Names a message's reasoning may be passed under; templates read the first, gpt-oss-style ones read "thinking".
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class ChatTemplateError(TokenizerError):
    """Base class of every chat template failure."""


class ChatTemplateNotFoundError(ChatTemplateError, LookupError):
    """No chat template (or no template of the requested name) is available."""


class ChatTemplateSyntaxError(ChatTemplateError):
    """The template source does not compile."""


class ChatTemplateRenderError(ChatTemplateError):
    """Rendering failed: the template called raise_exception, or failed on the given input."""


class ChatTemplateSecurityError(ChatTemplateRenderError):
    """The template tried to reach Python internals; the sandbox stopped it."""


class ChatTemplateInputError(ChatTemplateError, ValueError):
    """The arguments cannot be rendered (empty conversation, a message that is not a mapping, ...)."""


def _jinja2_version() -> tuple[int, ...]:
    return tuple(int(part) for part in jinja2.__version__.split(".")[:3] if part.isdigit())


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text for training masks; rendering keeps the body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(lineno)

    def _render_body(self, caller: Callable[[], str]) -> str:
        return caller()


class _ChatSandbox(ImmutableSandboxedEnvironment):
    def unsafe_undefined(self, obj: Any, attribute: str) -> Any:
        raise SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe")


class _TemplateNamespace(jinja2.utils.Namespace):
    """jinja's namespace(), refusing underscore-prefixed attribute names."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - jinja's signature trick, so namespace(self=1) works
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _check_namespace_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _check_namespace_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)


def _check_namespace_name(name: object) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise SecurityError(f"chat templates cannot store underscore-prefixed attributes on a namespace: {name!r}")


class _TemplateDict:
    """What `dict` is inside a template: construction and fromkeys, nothing to climb through."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _strftime_now(format: str) -> str:  # noqa: A002 - the name templates use
    return datetime.now().strftime(format)


@lru_cache(maxsize=1)
def _environment() -> _ChatSandbox:
    if _jinja2_version() < _MIN_JINJA2:
        raise ChatTemplateError(f"chat templates need jinja2>=3.1.6 (installed: {jinja2.__version__})")
    env = _ChatSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env


@lru_cache(maxsize=64)
def compile_chat_template(template: str) -> jinja2.Template:
    """Compile (cached per source string); ChatTemplateSyntaxError when the source is not a valid template."""
    try:
        return _environment().from_string(template)
    except TemplateSyntaxError as exc:
        raise ChatTemplateSyntaxError(f"chat template does not compile (line {exc.lineno}): {exc.message}") from exc
    except TemplateError as exc:
        raise ChatTemplateSyntaxError(f"chat template does not compile: {exc}") from exc


def special_tokens_template_vars(special: SpecialTokens, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The special-token variables transformers puts into every template's context (bos_token, eos_token, ...)
    plus named extra special tokens (tokenizer_config `extra_special_tokens`, e.g. image_token)."""
    result = {f"{role}_token": text for role, text in special.named().items()}
    result.update(extra or {})
    return result


def plain_template_data(value: Any) -> Any:
    """Rebuild `value` from plain JSON-like types so the template never sees objects with methods of their own;
    anything else becomes an inert placeholder naming its type, e.g. "<ndarray>" (as transformers does)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {plain_template_data(key): plain_template_data(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain_template_data(item) for item in value]
    if isinstance(value, tuple):
        return tuple(plain_template_data(item) for item in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: plain_template_data(getattr(value, field.name)) for field in dataclasses.fields(value)}
    model_dump = getattr(value, "model_dump", None)
    if callable(model_dump):
        return plain_template_data(model_dump())
    return f"<{type(value).__name__}>"


def _alias_reasoning(message: dict[str, Any]) -> dict[str, Any]:
    reasoning = next((message[key] for key in _REASONING_FIELDS if message.get(key) is not None), None)
    if reasoning is None:
        return message
    return {"thinking": reasoning, **message, "reasoning_content": reasoning}


def _prepare_messages(messages: Sequence[Any]) -> list[dict[str, Any]]:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise ChatTemplateInputError("messages must be a list of message objects")
    if len(messages) == 0:
        raise ChatTemplateInputError("cannot apply a chat template to an empty conversation")
    prepared = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ChatTemplateInputError(f"message {index} is not a mapping: {type(message).__name__}")
        message = plain_template_data({key: item for key, item in message.items() if item is not None})
        prepared.append(_alias_reasoning(message))
    return prepared


def _tag_final_message(template: str, chat: list[dict[str, Any]], field: str) -> str:
    """Append the continue tag to the text being continued; returns that text (before tagging)."""
    final = chat[-1].get(field)
    if final is None:
        raise ChatTemplateInputError(f'continue_final_message is set but the final message has no "{field}"')
    fields = [field]
    if field in _REASONING_FIELDS:
        fields = [name for name in _REASONING_FIELDS if chat[-1].get(name) == final]
    if not any(name in template for name in fields):
        raise ChatTemplateInputError(f'continue_final_message: the chat template never reads "{field}"')
    if isinstance(final, (list, tuple)):
        for block in reversed(final):
            if isinstance(block, Mapping) and isinstance(block.get("text"), str):
                text = block["text"]
                block["text"] = text + _CONTINUE_TAG
                return text
        raise ChatTemplateInputError("continue_final_message is set but the final message has no text to continue")
    if not isinstance(final, str):
        raise ChatTemplateInputError(f'continue_final_message: "{field}" of the final message is not text')
    for name in fields:
        chat[-1][name] = chat[-1][name] + _CONTINUE_TAG
    return final


def _cut_at_continue_tag(rendered: str, final_text: str) -> str:
    marker = _CONTINUE_TAG.strip()
    if final_text.strip() not in rendered or marker not in rendered:
        raise ChatTemplateInputError(
            "continue_final_message is set but the final message does not appear in the rendered chat "
            "(the template drops or rewrites it)"
        )
    at = rendered.rindex(marker)
    if rendered[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
        return rendered[:at]
    return rendered[:at].rstrip()  # the template trimmed the message's trailing whitespace


def _check_list_of_mappings(value: Any, what: str) -> None:
    if value is None:
        return
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ChatTemplateInputError(f"{what} must be a list of objects")
    for index, item in enumerate(value):
        if not isinstance(item, Mapping):
            raise ChatTemplateInputError(f"{what}[{index}] must be an object (a JSON schema / a document)")


def render_chat_template(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    documents: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = False,
    continue_final_message: bool | str = False,
    special_tokens: Mapping[str, str] | None = None,
    **kwargs: Any,
) -> str:
    """Render one conversation exactly as transformers' `tokenizer.apply_chat_template(messages, tokenize=False)`.

    special_tokens: the template variables for the tokenizer's special tokens (see special_tokens_template_vars);
    kwargs win over them. continue_final_message: True continues the final message's "content", a string names
    the field to continue (e.g. "reasoning_content"). Raises a ChatTemplateError subclass on any failure.
    """
    if continue_final_message and add_generation_prompt:
        raise ChatTemplateInputError("continue_final_message and add_generation_prompt cannot be used together")
    _check_list_of_mappings(tools, "tools")
    _check_list_of_mappings(documents, "documents")
    compiled = compile_chat_template(template)
    try:
        chat = _prepare_messages(messages)
        context = plain_template_data({**(special_tokens or {}), **kwargs})
        tools, documents = plain_template_data(tools), plain_template_data(documents)
    except RecursionError as exc:
        raise ChatTemplateInputError("the chat input is nested too deeply") from exc
    final_text = None
    if continue_final_message:
        field = continue_final_message if isinstance(continue_final_message, str) else "content"
        final_text = _tag_final_message(template, chat, field)
    try:
        rendered = compiled.render(
            messages=chat,
            tools=tools,
            documents=documents,
            add_generation_prompt=add_generation_prompt,
            **context,
        )
    except SecurityError as exc:
        raise ChatTemplateSecurityError(f"chat template blocked by the sandbox: {exc}") from exc
    except TemplateError as exc:
        raise ChatTemplateRenderError(f"chat template error: {exc.message or exc}") from exc
    except RecursionError as exc:
        raise ChatTemplateRenderError("chat template recursion too deep") from exc
    except Exception as exc:  # a template can fail in any way on unexpected input (TypeError, KeyError, ...)
        raise ChatTemplateRenderError(f"chat template failed: {type(exc).__name__}: {exc}") from exc
    if final_text is not None:
        return _cut_at_continue_tag(rendered, final_text)
    return rendered
