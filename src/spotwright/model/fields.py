"""Field types and base models shared by every user-facing YAML model.

Scenario files, NodePools and workload manifests are all Kubernetes-shaped YAML written by
hand, so they share one vocabulary: label keys and values, object names, resource
quantities parsed to integers at the edge, and a strict base model that turns a typo into
an error. Keeping it in one place means a label key is validated, and its error worded,
the same way wherever it appears. The validators raise ``ValueError`` messages of the form
"expected ..., got ..." that ``errors`` passes through unchanged.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Sequence
from typing import Annotated, Any, Literal, Protocol

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, Strict
from pydantic.alias_generators import to_camel

from spotwright.model.errors import show
from spotwright.model.resources import parse_cpu, parse_memory, parse_quantity

__all__ = [
    "CatalogLike",
    "ConfigModel",
    "Cpu",
    "Effect",
    "LabelKey",
    "LabelValue",
    "Labels",
    "LenientModel",
    "Memory",
    "ObjectMeta",
    "ObjectName",
    "RequirementValue",
    "StrictInt",
    "Whole",
    "check_operator_values",
    "unknown_family",
    "unknown_instance_type",
    "unknown_zone",
]


class CatalogLike(Protocol):
    """What configuration checks need from the instance-type catalog: names only."""

    def __contains__(self, name: object, /) -> bool: ...

    def names(self) -> Iterable[str]: ...


class ConfigModel(BaseModel):
    """Base of every user-facing model: unknown keys are errors, keys are camelCase.

    Forbidding extras is what turns a typo such as ``limts`` into an error instead of a
    silently ignored limit; models that mirror third-party manifests relax it locally.
    """

    model_config = ConfigDict(
        extra="forbid", populate_by_name=True, alias_generator=to_camel, frozen=True
    )


class LenientModel(ConfigModel):
    """For parts of real manifests full of fields spotwright does not model."""

    model_config = ConfigDict(extra="ignore")


# ---------------------------------------------------------------------------------------
# Field types

_INTEGER = re.compile(r"^-?[0-9]+$")
_NAME_PART = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_OBJECT_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def _label_key(key: str) -> str:
    prefix, _, name = key.rpartition("/")
    if (
        not name
        or len(name) > 63
        or not _NAME_PART.match(name)
        or (prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)))
        or (not prefix and "/" in key)
    ):
        raise ValueError(f"expected a label key like app or example.com/team, got {show(key)}")
    return key


def _label_value(value: str) -> str:
    if value and (len(value) > 63 or not _NAME_PART.match(value)):
        raise ValueError(
            "expected a label value (at most 63 letters, digits, '-', '_' or '.', "
            f"starting and ending with a letter or digit), got {show(value)}"
        )
    return value


def _object_name(value: str) -> str:
    if len(value) > 63 or not _OBJECT_NAME.match(value):
        raise ValueError(
            "expected a name of lowercase letters, digits, '-' and '.' (at most 63, "
            f"starting and ending with a letter or digit), got {show(value)}"
        )
    return value


def _quantity(parse: Any) -> Any:
    def convert(value: object) -> int:
        try:
            if isinstance(value, bool) or not isinstance(value, str | int | float):
                raise ValueError
            return int(parse(value))
        except _NotWhole:
            raise
        except ValueError:
            message = f"expected a Kubernetes quantity like 500m, 2 or 4Gi, got {show(value)}"
            raise ValueError(message) from None

    return convert


class _NotWhole(ValueError):
    pass


def _whole(value: Any) -> int:
    quantity = parse_quantity(value)
    if quantity != quantity.to_integral_value():
        raise _NotWhole(f"expected a whole number, got {show(value)}")
    return int(quantity)


def _text_or_int(value: object) -> object:
    # Requirement values are strings in Kubernetes, but ``values: [4]`` is an obvious intent.
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


LabelKey = Annotated[str, AfterValidator(_label_key)]
LabelValue = Annotated[str, AfterValidator(_label_value)]
Labels = dict[LabelKey, LabelValue]
ObjectName = Annotated[str, AfterValidator(_object_name)]
#: CPU in millicores, parsed from ``500m``/``2``/``1.5``.
Cpu = Annotated[int, BeforeValidator(_quantity(parse_cpu))]
#: Memory in bytes, parsed from ``4Gi``/``512Mi``/``1e9``.
Memory = Annotated[int, BeforeValidator(_quantity(parse_memory))]
#: A whole count written as a quantity (``nvidia.com/gpu: 1``, ``nodes: "10"``).
Whole = Annotated[int, BeforeValidator(_quantity(_whole))]
StrictInt = Annotated[int, Strict()]
RequirementValue = Annotated[str, BeforeValidator(_text_or_int)]

Effect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


class ObjectMeta(LenientModel):
    """Object metadata; server-written fields (uid, resourceVersion...) are ignored."""

    name: ObjectName
    namespace: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


# ---------------------------------------------------------------------------------------
# Checks shared by NodePools, pods and events


def check_operator_values(operator: str, values: Sequence[str]) -> None:
    """Kubernetes' and Karpenter's rules on how many values an operator takes.

    Enforced while validating, so a validated requirement can always be converted (the
    ``Gte``/``Lte`` rewrite needs its one integer).
    """
    if operator in ("In", "NotIn") and not values:
        raise ValueError(f"expected at least one value for {operator}, got none")
    if operator in ("Exists", "DoesNotExist") and values:
        raise ValueError(f"expected no values for {operator}, got {show(list(values))}")
    if operator in ("Gt", "Lt", "Gte", "Lte") and (
        len(values) != 1 or not _INTEGER.match(values[0])
    ):
        raise ValueError(
            f"expected exactly one integer value for {operator}, got {show(list(values))}"
        )


def unknown_zone(zone: str, zones: Sequence[str]) -> str:
    """The message for a zone outside the scenario's zones."""
    return f"expected one of the scenario's zones ({', '.join(zones)}), got {show(zone)}"


def unknown_instance_type(name: str, catalog: CatalogLike) -> str:
    """The message for a type the catalog lacks, with the closest names as suggestions."""
    return _unknown("instance type", name, catalog.names())


def unknown_family(family: str, catalog: CatalogLike) -> str | None:
    """The message for a family no catalog type belongs to, or None if some type does."""
    families = {name.partition(".")[0] for name in catalog.names()}
    return None if family in families else _unknown("instance family", family, families)


def _unknown(what: str, value: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(value, list(known), n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return f"expected an {what} from the catalog, got unknown {what} {show(value)}{hint}"
