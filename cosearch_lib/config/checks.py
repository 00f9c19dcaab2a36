"""The one error type of the settings and the checks every configuration dataclass runs.

Each check names the setting by its dotted profile key (``training.grpo.clip_eps``; a class name
where the setting has no profile key), the value given and what is allowed, so a bad line of a
profile is found from the message alone. Every check raises :class:`ConfigError`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from typing import Any


class ConfigError(ValueError):
    """A profile file or a setting that does not match the configuration dataclasses (a ValueError,
    so ``except ValueError`` catches it too)."""


#: Marks a field that receives the profile's one shared object (from_dict injects it; a YAML section may not set it).
SHARED = {"shared": True}
#: Marks the ProfileConfig field that *is* that shared object (its top-level ``search:`` or ``rules:``).
SHARES = {"shares": True}
#: Marks a field that changes only how fast results come, not which: left out of cache fingerprints.
SPEED_ONLY = {"speed_only": True}
#: Marks a field that says where files are, not what they hold (data.root): left out of cache fingerprints too.
LOCATION_ONLY = {"location_only": True}
#: Marks a field added after caches were keyed, whose None means "as before": left out of cache fingerprints
#: while None, so that the keys of profiles that do not set it stay as they were.
KEYED_WHEN_SET = {"keyed_when_set": True}


def invalid(key: str, value: Any, allowed: str) -> ConfigError:
    """The error for setting ``key``: ``"<key> must be <allowed>, got <value>"``."""
    return ConfigError(f"{key} must be {allowed}, got {value!r}")


def _bounds(low: Any, high: Any, low_open: bool = False, high_open: bool = False) -> str:
    if low is not None and high is not None:
        return f" in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
    if low is not None:
        return f" {'>' if low_open else '>='} {low}"
    if high is not None:
        return f" {'<' if high_open else '<='} {high}"
    return ""


def _why(why: str) -> str:
    return f" ({why})" if why else ""


def check_int(key: str, value: Any, minimum: int | None = None, maximum: int | None = None, *,
              allow_none: bool = False, why: str = "") -> None:
    """``value`` is an int (not a bool) within ``minimum``..``maximum`` (either may be None: unbounded)."""
    if value is None and allow_none:
        return
    ok = isinstance(value, int) and not isinstance(value, bool)
    if not ok or (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise invalid(key, value, f"an integer{_bounds(minimum, maximum)}{' or null' if allow_none else ''}{_why(why)}")


def check_number(key: str, value: Any, low: float | None = None, high: float | None = None, *,
                 low_open: bool = False, high_open: bool = False, finite: bool = True, allow_none: bool = False,
                 why: str = "") -> None:
    """``value`` is a real number (not a bool, never NaN; finite unless ``finite=False``) between
    ``low`` and ``high`` (either may be None: unbounded; ``*_open`` excludes the bound itself)."""
    if value is None and allow_none:
        return
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and not math.isnan(value)
    ok = ok and (math.isfinite(value) or not finite)
    ok = ok and (low is None or (value > low if low_open else value >= low))
    ok = ok and (high is None or (value < high if high_open else value <= high))
    if not ok:
        kind = f"{'a finite' if finite else 'a'} number{_bounds(low, high, low_open, high_open)}"
        raise invalid(key, value, f"{kind}{' or null' if allow_none else ''}{_why(why)}")


def check_choice(key: str, value: Any, allowed: Iterable[Any], *, why: str = "") -> None:
    """``value`` is one of ``allowed``."""
    allowed = tuple(allowed)
    if value not in allowed:
        raise invalid(key, value, f"one of {', '.join(map(repr, allowed))}{_why(why)}")


def check_bool(key: str, value: Any, *, allow_none: bool = False, why: str = "") -> None:
    """``value`` is True or False (or None when ``allow_none``)."""
    if not (isinstance(value, bool) or (value is None and allow_none)):
        raise invalid(key, value, f"a bool{' or null' if allow_none else ''}{_why(why)}")


def check_str(key: str, value: Any, *, why: str = "") -> None:
    """``value`` is a string with something other than white space in it."""
    if not isinstance(value, str) or not value.strip():
        raise invalid(key, value, f"a non-empty string{_why(why)}")


class Fields:
    """The checks above over fields of one config object, each naming ``<section>.<field>``:
    ``Fields("search", self).ints("topn", "topk", minimum=1)``."""

    def __init__(self, section: str, obj: Any) -> None:
        self.section, self.obj = section, obj

    def key(self, name: str) -> str:
        return f"{self.section}.{name}"

    def fail(self, name: str, allowed: str) -> ConfigError:
        """The error for field ``name`` (its current value) with ``allowed`` saying what would do."""
        return invalid(self.key(name), getattr(self.obj, name), allowed)

    def ints(self, *names: str, **limits: Any) -> None:
        for name in names:
            check_int(self.key(name), getattr(self.obj, name), **limits)

    def numbers(self, *names: str, **limits: Any) -> None:
        for name in names:
            check_number(self.key(name), getattr(self.obj, name), **limits)

    def bools(self, *names: str, **options: Any) -> None:
        for name in names:
            check_bool(self.key(name), getattr(self.obj, name), **options)

    def strs(self, *names: str, **options: Any) -> None:
        for name in names:
            check_str(self.key(name), getattr(self.obj, name), **options)

    def positive_ints(self, name: str) -> tuple[int, ...]:
        """Field ``name`` as a non-empty tuple of integers >= 1 (a YAML list becomes the tuple); ConfigError otherwise."""
        value = getattr(self.obj, name)
        ks = () if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__") else tuple(value)
        if not ks or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in ks):
            raise self.fail(name, "a non-empty sequence of integers >= 1")
        return ks

    def choice(self, name: str, allowed: Iterable[Any], **options: Any) -> None:
        check_choice(self.key(name), getattr(self.obj, name), allowed, **options)
