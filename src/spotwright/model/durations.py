"""Durations as people write them in Kubernetes and Karpenter YAML: ``90s``, ``10m``, ``1h30m``.

Scenario timelines, NodePool ``expireAfter`` and disruption windows are all written this
way, so one parser turns them into float seconds at the edge and everything downstream
does plain arithmetic. The grammar follows Go's ``time.ParseDuration`` (which Karpenter
uses) restricted to the units that make sense for a cluster: ``h``, ``m``, ``s`` and ``ms``,
largest first. ``Never`` is accepted only where the caller says so, because for most fields
("at", "for", "duration") an infinite value is a mistake rather than a setting.
"""

from __future__ import annotations

import math
import re
from typing import Annotated

from pydantic import BeforeValidator

from spotwright.model.errors import show

__all__ = ["NEVER", "Duration", "DurationOrNever", "format_duration", "parse_duration"]

#: What ``parse_duration("Never", allow_never=True)`` returns.
NEVER = math.inf

_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
# Units in descending order, each at most once: "1h30m" but not "30m1h" or "1m1m".
_DURATION = re.compile(
    rf"^(?:(?P<h>{_NUMBER})h)?(?:(?P<m>{_NUMBER})m(?!s))?(?:(?P<s>{_NUMBER})s)?"
    rf"(?:(?P<ms>{_NUMBER})ms)?$"
)
_PLAIN = re.compile(rf"^{_NUMBER}$")
_EXAMPLES = "like 90s, 10m, 2h or 1h30m"


def parse_duration(text: str | int | float, *, allow_never: bool = False) -> float:
    """Return the duration in seconds; plain numbers (and numeric strings) are seconds.

    Raises ``ValueError`` whose message says what was expected, so validators can pass
    it straight to the user. Negative, NaN and (unless ``allow_never``) infinite values
    are rejected: none of the fields that take a duration can use them.
    """
    if isinstance(text, bool):
        raise ValueError(f"expected a duration {_EXAMPLES}, got {str(text).lower()}")
    if isinstance(text, int | float):
        return _check_number(float(text), text, allow_never=allow_never)
    if not isinstance(text, str):
        raise ValueError(f"expected a duration {_EXAMPLES}, got {show(text)}")
    stripped = text.strip()
    if stripped == "Never":
        if allow_never:
            return NEVER
        raise ValueError(f"expected a finite duration {_EXAMPLES}, got Never")
    if stripped.startswith("-"):
        raise ValueError(f"expected a duration that is not negative, got {show(text)}")
    if _PLAIN.match(stripped):
        return _check_number(float(stripped), text, allow_never=allow_never)
    match = _DURATION.match(stripped)
    if not stripped or not match:
        never = " or Never" if allow_never else ""
        raise ValueError(f"expected a duration {_EXAMPLES}{never}, got {show(text)}")
    return sum(
        float(value) * _UNIT_SECONDS[unit]
        for unit, value in match.groupdict().items()
        if value is not None
    )


def _check_number(seconds: float, original: object, *, allow_never: bool) -> float:
    if math.isnan(seconds):
        raise ValueError(f"expected a duration {_EXAMPLES}, got {show(original)}")
    if seconds < 0:
        raise ValueError(f"expected a duration that is not negative, got {show(original)}")
    if math.isinf(seconds) and not allow_never:
        raise ValueError(f"expected a finite duration {_EXAMPLES}, got {show(original)}")
    return seconds


def format_duration(seconds: float) -> str:
    """Render seconds compactly for reports and log lines: ``1h05m``, ``3m``, ``45s``.

    Minutes are zero-padded after hours and seconds after minutes so columns line up;
    zero trailing units are dropped. Fractions of a second are kept exactly (shortest
    round-tripping float form), so ``parse_duration(format_duration(x))`` gives ``x`` back
    for whole seconds and to within float rounding otherwise. Infinity is ``Never``.
    """
    if math.isnan(seconds):
        raise ValueError("cannot format NaN as a duration")
    if math.isinf(seconds):
        return "Never" if seconds > 0 else "-Never"
    if seconds < 0:
        return "-" + format_duration(-seconds)
    whole = int(seconds)
    fraction = seconds - whole
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if fraction:
        sec_text = _shortest(secs + fraction)
        # Keep the zero padding for "1m05.5s" but never lose digits to it.
        if minutes or hours:
            sec_text = sec_text.rjust(len(sec_text) + (1 if secs < 10 else 0), "0")
    else:
        sec_text = f"{secs:02d}" if (minutes or hours) else str(secs)
    if hours:
        out = f"{hours}h{minutes:02d}m"
        return out + (f"{sec_text}s" if secs or fraction else "")
    if minutes:
        return f"{minutes}m" + (f"{sec_text}s" if secs or fraction else "")
    return f"{sec_text}s"


def _shortest(value: float) -> str:
    text = repr(value)
    if "e" in text or "E" in text:
        # Tiny fractions would print in exponent form, which the grammar does not accept.
        text = f"{value:.9f}".rstrip("0").rstrip(".")
    return text


def _duration_field(value: object) -> float:
    return parse_duration(_duration_input(value))


def _duration_or_never_field(value: object) -> float:
    return parse_duration(_duration_input(value), allow_never=True)


def _duration_input(value: object) -> str | int | float:
    if isinstance(value, str | int | float):
        return value
    raise ValueError(f"expected a duration {_EXAMPLES}, got {show(value)}")


#: A pydantic field type: a duration written as text or seconds, validated to float seconds.
Duration = Annotated[float, BeforeValidator(_duration_field)]
#: Like ``Duration`` but also accepting ``Never`` (stored as ``math.inf``).
DurationOrNever = Annotated[float, BeforeValidator(_duration_or_never_field)]
