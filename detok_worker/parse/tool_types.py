"""The JSON types of tool-call parameters, by the request's tool schemas: the XML-parameter families write every value
as text, and vLLM turns it into JSON by its parameter's schema (vllm/tool_parsers/utils.py: the schema's types, then
the first of null, integer, number, boolean, object, array, string that the text converts to).

The front derives, once per request, what the worker needs from the request's tools (`parameter_types`): per function
(the first of a name), its parameters whose value is not simply text, each with the types its schema allows, in that
order of preference; a parameter it does not name (or a function without properties) stays a string, as in vLLM. The
worker reads it back (`ToolTypes.from_json`) and converts each complete value (`value_json`).
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import msgspec

# vLLM's order of preference between a schema's types
TYPE_ORDER = ("null", "integer", "number", "boolean", "object", "array", "string")
# the other spellings vLLM reads as those types (after stripping and lowercasing)
_TYPE_ALIASES = {
    "str": "string", "text": "string", "varchar": "string", "char": "string", "enum": "string",
    "int": "integer", "int32": "integer", "int64": "integer", "uint": "integer", "uint32": "integer",
    "uint64": "integer", "long": "integer", "short": "integer", "unsigned": "integer",
    "float": "number", "float32": "number", "float64": "number", "double": "number",
    "bool": "boolean", "dict": "object", "arr": "array", "list": "array", "sequence": "array",
}  # fmt: skip
# the type name of a decoded JSON value (an object for the rest)
_JSON_TYPES = {type(None): "null", bool: "boolean", int: "integer", float: "number", str: "string", list: "array"}
_TEXT = ("string",)
_UNTYPED: Mapping[str, tuple[str, ...]] = MappingProxyType({})
_DECODE_TYPES = msgspec.json.Decoder(dict[str, dict[str, list[str]]])


def _schema_types(schema: Any) -> set[str]:
    """The type names a parameter's schema allows: `type` (a name or a list), the types of its `enum` values, and
    those of its anyOf / oneOf / allOf choices; "string" when it names none (vLLM's reading)."""
    if not isinstance(schema, dict):
        return {"string"}
    types: set[str] = set()
    declared = schema.get("type")
    if isinstance(declared, str):
        types.add(declared)
    elif isinstance(declared, list):
        types.update(name for name in declared if isinstance(name, str))
    values = schema.get("enum")
    if isinstance(values, list):
        types.update(_JSON_TYPES.get(type(value), "object") for value in values)
    for choice in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(choice), list):
            for option in schema[choice]:
                types |= _schema_types(option)
    return types or {"string"}


def _preferred(types: set[str]) -> list[str]:
    """The known types among `types`, in vLLM's order of preference (unknown names are no type)."""
    known = {_TYPE_ALIASES.get(name.strip().lower(), name.strip().lower()) for name in types}
    return [name for name in TYPE_ORDER if name in known]


def parameter_types(tools: Any) -> str:
    """What the worker needs of a request's tools, as compact JSON: {function: {parameter: [types]}} for every
    function tool (a parameter declared a string is one: DSML reads an untyped value as JSON, a string one as text);
    "" for a request without tools."""
    if not tools or not isinstance(tools, list):
        return ""
    functions: dict[str, dict[str, list[str]]] = {}
    for tool in tools:
        is_function = isinstance(tool, dict) and tool.get("type", "function") == "function"
        function = tool.get("function") if is_function else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            continue
        if function["name"] in functions:
            continue  # vLLM reads the first tool of a name
        parameters = function.get("parameters")
        properties = parameters.get("properties") if isinstance(parameters, dict) else None
        typed: dict[str, list[str]] = {}
        for name, schema in (properties or {}).items() if isinstance(properties, dict) else ():
            if isinstance(schema, dict):
                typed[name] = _preferred(_schema_types(schema))
        functions[function["name"]] = typed
    return json.dumps(functions, ensure_ascii=False, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class ToolTypes:
    """A request's tools as the worker reads them: None when the request gave none (every function name is valid
    and every value a string), else function -> its typed parameters."""

    functions: Mapping[str, Mapping[str, tuple[str, ...]]] | None = None

    @classmethod
    def from_json(cls, text: str) -> ToolTypes:
        """Raises ValueError for text that is no such JSON."""
        if not text:
            return cls()
        try:
            decoded = _DECODE_TYPES.decode(text)
        except msgspec.DecodeError as exc:
            raise ValueError(f"bad tool parameter types: {exc}") from exc
        return cls({name: {key: tuple(types) for key, types in typed.items()} for name, typed in decoded.items()})

    def knows(self, function: str) -> bool:
        """Whether a call may name `function` (vLLM's check of the names, where a family has it)."""
        return self.functions is None or function in self.functions

    def of(self, function: str) -> Mapping[str, tuple[str, ...]]:
        """The function's parameters and their types (a parameter its schema does not name has none)."""
        if self.functions is None:
            return _UNTYPED
        return self.functions.get(function, _UNTYPED)


def _finite_json(value: Any) -> str | None:
    """`value` as JSON text, or None where it holds an infinity or NaN (no JSON)."""
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    except ValueError:
        return None


def _loaded(text: str) -> str | None:
    """`text` parsed as JSON and written back, or None when it is no (finite) JSON."""
    try:
        return _finite_json(json.loads(text))
    except (ValueError, RecursionError):
        return None


def value_json(text: str, types: tuple[str, ...]) -> str:
    """A parameter's value text as the JSON vLLM makes of it: the first of `types` (in TYPE_ORDER) that the text
    converts to; with none, the text parsed as JSON, else the text as a string."""
    for name in types:
        converted: str | None = None
        if name == "null":
            converted = "null" if text.lower() == "null" else None
        elif name == "integer":
            with contextlib.suppress(ValueError):
                converted = json.dumps(int(text))
        elif name == "number":
            try:
                number = float(text)
            except ValueError:
                number = math.inf
            if math.isfinite(number):
                converted = json.dumps(int(number) if number == int(number) else number)
        elif name == "boolean":
            word = text.lower().strip()
            converted = "true" if word in ("true", "1") else "false" if word in ("false", "0") else None
        elif name in ("object", "array"):
            converted = _loaded(text)
        else:
            return json.dumps(text, ensure_ascii=False)
        if converted is not None:
            return converted
    loaded = _loaded(text)
    return loaded if loaded is not None else json.dumps(text, ensure_ascii=False)


def loaded_value_json(text: str, types: tuple[str, ...] | None) -> str:
    """A value read as JSON where it parses as such (else as text), then fitted to its schema `types` as vLLM's
    parser engine fits it: a string or another scalar (as its JSON text) converts as `value_json` converts text; an
    object or an array stays as it is (vLLM also fits their members to a nested schema, which detok does not have)."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        value = text
    written = _finite_json(value)
    if written is None:  # an infinity or NaN
        value, written = text, json.dumps(text, ensure_ascii=False)
    if isinstance(value, dict | list) or types is None:
        return written
    return value_json(value if isinstance(value, str) else written, types)


def is_text(types: tuple[str, ...] | None) -> bool:
    """Whether a value of these types is its text as a JSON string (None: a parameter the schema leaves untyped)."""
    return types is None or types == _TEXT
