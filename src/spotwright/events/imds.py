"""IMDS mode: turn what a node reads from its instance metadata into interruption events.

The handler running on a node polls a few metadata paths; this module parses one body from
one of them into the same ``InterruptionEvent`` the queue produces, with ``source="imds"``.
Parsing is pure: the reader passes its instance id, its node name and the time of the read,
and no id ever depends on that time, so polling the same notice every two seconds yields
the same event each time (and the same spot notice or rebalance recommendation read here
and received through the queue has the same id; see ``notice_event_id``).

A path the handler should not have asked about is ``UnknownEvent``; a body that does not
have its path's shape is ``MalformedEvent``; both name the path and the field. A 404 is the
caller's business (for these paths it means "nothing announced"), so it never gets here.
"""

from __future__ import annotations

from collections.abc import Callable

from spotwright.events import (
    _imds_lifecycle,
    _imds_maintenance,
    _imds_rebalance,
    _imds_spot,
)
from spotwright.events._common import is_instance_id
from spotwright.events._imds_common import Reading
from spotwright.events.model import InterruptionEvent, MalformedEvent, UnknownEvent

__all__ = ["IMDS_PATHS", "POLLED_PATHS", "normalize_path", "parse_imds"]

_Parser = Callable[[Reading], list[InterruptionEvent]]
_PARSERS: dict[str, _Parser] = {
    _imds_spot.INSTANCE_ACTION: _imds_spot.parse,
    _imds_spot.TERMINATION_TIME: _imds_spot.parse_legacy,
    _imds_rebalance.PATH: _imds_rebalance.parse,
    _imds_maintenance.PATH: _imds_maintenance.parse,
    _imds_lifecycle.PATH: _imds_lifecycle.parse,
}
#: Every path ``parse_imds`` understands, relative to ``/latest/meta-data/``.
IMDS_PATHS: tuple[str, ...] = tuple(_PARSERS)
#: The paths an IMDS-mode handler polls (the legacy termination-time is covered by
#: instance-action, which carries the same time and the action too).
POLLED_PATHS: tuple[str, ...] = (
    _imds_spot.INSTANCE_ACTION,
    _imds_rebalance.PATH,
    _imds_maintenance.PATH,
    _imds_lifecycle.PATH,
)
_PREFIXES = ("/latest/meta-data/", "latest/meta-data/", "/meta-data/", "meta-data/", "/")


def normalize_path(path: str) -> str:
    """``/latest/meta-data/spot/instance-action`` and ``spot/instance-action`` alike."""
    text = path.strip()
    for prefix in _PREFIXES:
        if text.startswith(prefix):
            text = text[len(prefix) :]
            break
    return text.rstrip("/")


def parse_imds(
    path: str,
    body: str | bytes,
    *,
    instance_id: str,
    node: str | None = None,
    now: float,
) -> list[InterruptionEvent]:
    """Parse the body one metadata path returned; an empty list means nothing to do.

    ``path`` may be given with or without ``/latest/meta-data/``. ``now`` is the time of
    the read (epoch seconds): it becomes ``start`` for the bodies that carry no time of
    their own (scheduled maintenance, target lifecycle state) and never enters an id.
    """
    if not is_instance_id(instance_id):
        raise ValueError(f"instance_id must be an EC2 instance id, not {instance_id!r}")
    relative = normalize_path(path)
    parser = _PARSERS.get(relative)
    if parser is None:
        raise UnknownEvent(
            f"IMDS {relative or path!r}: not an interruption path "
            f"(understood: {', '.join(IMDS_PATHS)})"
        )
    if isinstance(body, bytes):
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MalformedEvent(f"IMDS {relative}: body is not UTF-8 ({exc.reason})") from None
    else:
        text = body
    return parser(Reading(path=relative, text=text, instance_id=instance_id, node=node, now=now))
