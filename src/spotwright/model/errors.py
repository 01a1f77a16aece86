"""One error type for everything wrong with a configuration file, phrased for its author.

A scenario or NodePool file is written by hand, so when it is wrong the user needs the
file, the place inside it (``spec.nodePools[0].spec.limits.cpu``, in the YAML's own
camelCase keys) and what was expected there. Pydantic knows all of that but says it in
its own vocabulary (``Input should be a valid integer``, loc tuples with union tags in
them) and attaches a long traceback. This module translates: every validation, YAML and
file-system problem becomes a ``Problem`` and they are raised together as one
``ScenarioError``, so a user fixes the whole file in one pass instead of one error a run.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import yaml
from pydantic import BaseModel, Discriminator, ValidationError
from pydantic_core import ErrorDetails

__all__ = [
    "Problem",
    "ScenarioError",
    "format_path",
    "load_yaml_documents",
    "problems_from_validation",
    "read_text",
    "read_yaml",
    "show",
]


class Problem(NamedTuple):
    """One thing wrong with a file: where (a dotted path, or ``line L column C``) and what."""

    path: str
    message: str


class ScenarioError(Exception):
    """A configuration file could not be loaded; ``problems`` lists every reason found.

    ``str()`` gives one ``FILE: PATH: message`` line per problem, ready to print.
    """

    def __init__(self, source: str, problems: Iterable[Problem]) -> None:
        self.source = source
        self.problems: list[Problem] = list(problems) or [Problem("", "invalid file")]
        super().__init__(str(self))

    def __str__(self) -> str:
        return "\n".join(
            f"{self.source}: {p.path}: {p.message}" if p.path else f"{self.source}: {p.message}"
            for p in self.problems
        )


_IDENTIFIER_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


def format_path(parts: Sequence[str | int]) -> str:
    """Dotted path in the YAML's own keys: ``spec.workloads[0].requests["nvidia.com/gpu"]``.

    Keys containing dots or slashes are quoted so the path stays unambiguous.
    """
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part and set(part) <= _IDENTIFIER_CHARS:
            out += f".{part}" if out else part
        else:
            out += f"[{json.dumps(part)}]"
    return out


def show(value: object) -> str:
    """How a YAML value is quoted back to the user in a message: short, in YAML terms."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        text = json.dumps(value)
        return text if len(text) <= 60 else text[:56] + '..."'
    if isinstance(value, Mapping):
        if not value:
            return "an empty mapping"
        inline = "{" + ", ".join(f"{k}: {_bare(v)}" for k, v in value.items()) + "}"
        if len(inline) <= 60:
            return inline
        keys = ", ".join(str(k) for k in list(value)[:6])
        return f"a mapping (keys: {keys}{', ...' if len(value) > 6 else ''})"
    if isinstance(value, list | tuple):
        if not value:
            return "an empty list"
        inline = "[" + ", ".join(show(v) for v in value) + "]"
        return inline if len(inline) <= 60 else f"a list of {len(value)} items"
    return repr(value)


def _bare(value: object) -> str:
    # Inside an inline mapping, plain scalars read better unquoted: {app: web}.
    if isinstance(value, str) and value and value.replace("-", "").replace(".", "").isalnum():
        return value
    return show(value)


# ---------------------------------------------------------------------------------------
# Pydantic ValidationError → Problems


#: Extra words for values that are right in an older API version and wrong in this one.
_HINTS = {
    "karpenter.sh/v1beta1": "karpenter.sh/v1beta1 NodePools must be converted to karpenter.sh/v1",
    "WhenUnderutilized": "karpenter.sh/v1 renamed WhenUnderutilized to WhenEmptyOrUnderutilized",
}

_EXPECTED = {
    "int_type": "expected an integer",
    "int_parsing": "expected an integer",
    "int_from_float": "expected a whole number",
    "float_type": "expected a number",
    "float_parsing": "expected a number",
    "bool_type": "expected true or false",
    "bool_parsing": "expected true or false",
    "string_type": "expected a string",
    "list_type": "expected a list",
    "tuple_type": "expected a list",
    "dict_type": "expected a mapping",
    "model_type": "expected a mapping",
    "model_attributes_type": "expected a mapping",
    "none_required": "expected nothing",
}


def problems_from_validation(
    exc: ValidationError, data: object, root: type[BaseModel], prefix: Sequence[str | int] = ()
) -> list[Problem]:
    """Translate a pydantic ``ValidationError`` raised while validating ``data`` as ``root``.

    The raw ``data`` is walked along each error's loc so the path uses the keys exactly
    as written, and loc parts that are not in the data (union tags, validator names) are
    dropped. The model classes are walked in step so an unknown key can list the keys
    that would have been accepted.
    """
    problems: list[Problem] = []
    seen: set[Problem] = set()
    for error in exc.errors(include_url=False):
        parts, parent_type = _walk(error["loc"], data, root)
        problem = Problem(format_path([*prefix, *parts]), _message(error, parent_type))
        if problem not in seen:
            seen.add(problem)
            problems.append(problem)
    return problems


def _message(error: ErrorDetails, parent_type: Any) -> str:
    kind = error["type"]
    value = error.get("input")
    ctx = error.get("ctx") or {}
    if kind == "missing":
        return "required key missing"
    if kind == "extra_forbidden":
        key = error["loc"][-1] if error["loc"] else "?"
        accepted = _accepted_keys(parent_type)
        listing = f" (expected one of: {', '.join(accepted)})" if accepted else ""
        return f"unknown key {json.dumps(str(key))}{listing}"
    if kind == "literal_error":
        choices = str(ctx.get("expected", "?"))
        several = " or " in choices or "," in choices
        text = f"expected one of {choices}" if several else f"expected {choices}"
        hint = _HINTS.get(value) if isinstance(value, str) else None
        return f"{text}, got {show(value)}" + (f" ({hint})" if hint else "")
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        sign = {
            "greater_than_equal": "≥",
            "greater_than": ">",
            "less_than_equal": "≤",
            "less_than": "<",
        }[kind]
        bound = next(iter(ctx.values()), "?")
        if isinstance(bound, float) and bound.is_integer():
            bound = int(bound)
        return f"expected a value {sign} {bound}, got {show(value)}"
    if kind == "too_short":
        return f"expected at least {ctx.get('min_length', 1)} item(s), got {show(value)}"
    if kind == "too_long":
        return f"expected at most {ctx.get('max_length', '?')} item(s), got {show(value)}"
    if kind == "string_pattern_mismatch":
        return f"expected text matching {ctx.get('pattern', '?')}, got {show(value)}"
    if kind in _EXPECTED:
        return f"{_EXPECTED[kind]}, got {show(value)}"
    message = error["msg"]
    for prefix in ("Value error, ", "Assertion failed, "):
        message = message.removeprefix(prefix)
    # Our own validators raise "expected ..., got ..." already; pydantic's leftovers get
    # the offending value appended so every line says what it got.
    if ", got " not in message and kind not in ("value_error", "assertion_error"):
        message += f", got {show(value)}"
    return message


# ---------------------------------------------------------------------------------------
# Walking data and types in step


def _walk(
    loc: tuple[str | int, ...], data: object, root: type[BaseModel]
) -> tuple[list[str | int], Any]:
    """Return the path parts that exist in ``data`` and the type that holds the last one."""
    parts: list[str | int] = []
    node: object = data
    tp: Any = root
    parent_type: Any = root
    for index, item in enumerate(loc):
        last = index == len(loc) - 1
        tp = _resolve(tp, node)
        if isinstance(node, list) and isinstance(item, int):
            parts.append(item)
            node = node[item] if 0 <= item < len(node) else None
            parent_type, tp = tp, _item_type(tp)
        elif isinstance(node, dict) and item in node:
            parts.append(item)
            node = node[item]
            parent_type, tp = tp, _field_type(tp, str(item))
        elif last and isinstance(node, dict):
            # A key that should be there and is not (missing), or is there and is unknown.
            parts.append(item)
            parent_type = tp
        # Anything else is a union tag or a validator's name: not part of the user's file.
    return parts, parent_type


def _resolve(tp: Any, node: object) -> Any:
    """Strip Annotated/Optional and pick the union member that ``node`` was validated as."""
    while True:
        origin = typing.get_origin(tp)
        if origin is typing.Annotated:
            base, *meta = typing.get_args(tp)
            discriminator = next((m for m in meta if isinstance(m, Discriminator)), None)
            if discriminator is not None and typing.get_origin(base) in (typing.Union, _UnionType):
                tp = _pick_tagged(base, discriminator, node)
            else:
                tp = base
            continue
        if origin in (typing.Union, _UnionType):
            members = [a for a in typing.get_args(tp) if a is not type(None)]
            models = [m for m in members if _is_model(m)]
            tp = models[0] if len(models) == 1 else (members[0] if len(members) == 1 else Any)
            continue
        return tp


_UnionType: Any = type(int | str)


def _pick_tagged(union: Any, discriminator: Discriminator, node: object) -> Any:
    chooser = discriminator.discriminator
    if not callable(chooser):
        return Any
    tag = typing.cast(Callable[[Any], Any], chooser)(node)
    for member in typing.get_args(union):
        if typing.get_origin(member) is typing.Annotated:
            for meta in typing.get_args(member)[1:]:
                if getattr(meta, "tag", None) == tag:
                    return member
    return Any


def _item_type(tp: Any) -> Any:
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (list, tuple, Sequence) and args:
        return args[0]
    return Any


def _field_type(tp: Any, key: str) -> Any:
    if _is_model(tp):
        for name, field in tp.model_fields.items():
            if key in (name, field.alias):
                return field.annotation
        return Any
    if typing.get_origin(tp) in (dict, Mapping):
        args = typing.get_args(tp)
        return args[1] if len(args) == 2 else Any
    return Any


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _accepted_keys(tp: Any) -> list[str]:
    tp = _resolve(tp, None)
    if not _is_model(tp):
        return []
    return [field.alias or name for name, field in tp.model_fields.items()]


# ---------------------------------------------------------------------------------------
# Reading a YAML file: file-system and syntax errors → Problems


def read_yaml(path: Path | str) -> Any:
    """Parse one YAML document from ``path``; every failure is a ``ScenarioError``.

    Syntax errors carry ``line L column C``; duplicate keys, which PyYAML would silently
    collapse to the last one, are errors too.
    """
    source = str(path)
    documents = load_yaml_documents(read_text(path), source) or [None]
    if len(documents) > 1:
        message = f"expected one YAML document, got {len(documents)} (separated by ---)"
        raise ScenarioError(source, [Problem("", message)])
    return documents[0]


def read_text(path: Path | str) -> str:
    """The file's UTF-8 text; a missing, unreadable or binary file is a ``ScenarioError``."""
    source = str(path)
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ScenarioError(source, [Problem("", "no such file")]) from None
    except IsADirectoryError:
        raise ScenarioError(
            source, [Problem("", "expected a YAML file, got a directory")]
        ) from None
    except UnicodeDecodeError as exc:
        message = f"expected UTF-8 text, got an undecodable byte at offset {exc.start}"
        raise ScenarioError(source, [Problem("", message)]) from None
    except OSError as exc:
        raise ScenarioError(source, [Problem("", exc.strerror or str(exc))]) from None


class _StrictLoader(yaml.SafeLoader):
    """A SafeLoader that rejects duplicate keys, which PyYAML would silently collapse."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            duplicate = key in seen
            seen.add(key)
        except TypeError:
            continue  # an unhashable key; construct_mapping reports it properly
        if duplicate:
            raise yaml.constructor.ConstructorError(
                "while reading a mapping",
                node.start_mark,
                f"found duplicate key {show(key)}",
                key_node.start_mark,
            )
    return loader.construct_mapping(node, deep=True)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_yaml_documents(text: str, source: str) -> list[Any]:
    """Every non-empty YAML document in ``text``; syntax errors become a ``ScenarioError``
    at ``line L column C`` (``source`` names the file in the message)."""
    try:
        documents = list(yaml.load_all(text, Loader=_StrictLoader))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1} column {mark.column + 1}" if mark else ""
        what = exc.problem or "malformed YAML"
        if exc.context and exc.context_mark and exc.context_mark is not mark:
            start = exc.context_mark
            what = f"{exc.context} (from line {start.line + 1} column {start.column + 1}): {what}"
        if "<block" in what:
            what += " (usually a line indented differently from its siblings)"
        raise ScenarioError(source, [Problem(where, f"invalid YAML: {what}")]) from None
    except yaml.YAMLError as exc:
        raise ScenarioError(source, [Problem("", f"invalid YAML: {exc}")]) from None
    return [d for d in documents if d is not None]
