"""Bottlerocket's user data: TOML settings, the user's merged with the node's own.

Bottlerocket reads no script: its user data is a TOML document of API settings, and a
node joins through ``settings.kubernetes`` (cluster name, API server, CA, labels, taints,
kubelet limits). The EC2NodeClass's ``userData`` may hold any other settings; it is parsed
(a syntax error becomes the class's problem, not a traceback), the node's settings are laid
over it (labels and taints are merged, the user's own entries kept unless the node
overrides the same key) and the result is written back as TOML. Python reads TOML but has
no writer, hence the small one here, enough for what settings documents contain.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import tomllib
from collections.abc import Mapping, Sequence
from typing import Any

from spotwright.model.nodeclass import KubeletConfiguration

__all__ = ["UserDataError", "bottlerocket_user_data", "check_toml", "dumps"]

_BARE = re.compile(r"[A-Za-z0-9_-]+")


class UserDataError(ValueError):
    """The class's ``userData`` cannot be combined with the generated bootstrap."""


def check_toml(text: str | None) -> dict[str, Any]:
    """The user's settings; raises ``UserDataError`` naming the syntax error."""
    if not text or not text.strip():
        return {}
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UserDataError(f"userData is not valid TOML for Bottlerocket: {exc}") from None


def bottlerocket_user_data(
    custom: str | None,
    *,
    cluster_name: str,
    endpoint: str,
    ca_bundle: str,
    dns_ips: Sequence[str],
    labels: Mapping[str, str],
    taints: Sequence[tuple[str, str, str]],
    max_pods: int | None,
    kubelet: KubeletConfiguration | None,
) -> str:
    """The user's settings with ``settings.kubernetes`` set for this node."""
    document = check_toml(custom)
    settings = _table(document, "settings")
    kube = _table(settings, "kubernetes")
    kube["cluster-name"] = cluster_name
    kube["api-server"] = endpoint
    kube["cluster-certificate"] = ca_bundle
    if dns_ips and "cluster-dns-ip" not in kube:
        kube["cluster-dns-ip"] = dns_ips[0] if len(dns_ips) == 1 else list(dns_ips)
    if max_pods is not None:
        kube["max-pods"] = max_pods
    if labels:
        _table(kube, "node-labels").update(labels)
    if taints:
        table = _table(kube, "node-taints")
        for key, value, effect in taints:
            entry = f"{value}:{effect}"
            current = table.get(key)
            listed = list(current) if isinstance(current, list) else []
            if entry not in listed:
                listed.append(entry)
            table[key] = listed
    if kubelet is not None:
        if kubelet.pods_per_core is not None:
            kube["pods-per-core"] = kubelet.pods_per_core
        for key, values in (
            ("system-reserved", kubelet.system_reserved),
            ("kube-reserved", kubelet.kube_reserved),
            ("eviction-hard", kubelet.eviction_hard),
        ):
            if values:
                _table(kube, key).update(values)
        # Bottlerocket has no soft-eviction settings (and refuses unknown ones at boot), so
        # evictionSoft, its grace periods and evictionMaxPodGracePeriod stay out, as in
        # Karpenter; docs/aws.md says so.
        scalars: tuple[tuple[str, int | bool | None], ...] = (
            ("image-gc-high-threshold-percent", kubelet.image_gc_high_threshold_percent),
            ("image-gc-low-threshold-percent", kubelet.image_gc_low_threshold_percent),
            ("cpu-cfs-quota-enforced", kubelet.cpu_cfs_quota),
        )
        for name, setting in scalars:
            if setting is not None:
                kube[name] = setting
    return dumps(document)


def _table(parent: dict[str, Any], key: str) -> dict[str, Any]:
    value = parent.setdefault(key, {})
    if not isinstance(value, dict):
        raise UserDataError(f"userData sets {key} to a value where a TOML table is expected")
    return value


# --- a TOML writer -------------------------------------------------------------------------


def _key(key: str) -> str:
    return key if _BARE.fullmatch(key) else json.dumps(key, ensure_ascii=False)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        inner = ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items())
        return "{" + inner + "}"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")


def dumps(document: Mapping[str, Any]) -> str:
    """TOML text for ``document``; tables become [headers], arrays of tables inline."""
    lines: list[str] = []
    _emit(document, (), lines)
    return "\n".join(lines).strip("\n") + "\n"


def _emit(table: Mapping[str, Any], path: tuple[str, ...], lines: list[str]) -> None:
    scalars = [(k, v) for k, v in table.items() if not isinstance(v, dict)]
    tables = [(k, v) for k, v in table.items() if isinstance(v, dict)]
    if path and (scalars or not tables):
        lines.append("")
        lines.append("[" + ".".join(_key(p) for p in path) + "]")
    for key, value in scalars:
        lines.append(f"{_key(key)} = {_value(value)}")
    for key, value in tables:
        _emit(value, (*path, key), lines)
