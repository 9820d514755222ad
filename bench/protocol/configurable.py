"""Shared base of defenses and attacks: keyword parameters checked when a suite loads.

A parameter's default fixes its type: an int default takes integers only, a float default
finite numbers, a bool default booleans, a str default strings. Numbers anywhere in a
parameter value must be finite and strings free of control characters, so nothing a cell
would trip on mid-run (or a record that cannot be rendered) gets past suite load.
"""
from __future__ import annotations

import difflib
import inspect
import math
import types
import typing
from typing import Any, Callable


class Configurable:
    """Subclasses declare their parameters as keyword arguments of __init__ with defaults.

    `links` names where the method comes from, each optional: {"paper": URL, "code": URL}. Every
    record snapshots its defense's and attack's links (bench/run/cells.py), so pages link the paper
    and the code as they were when the cell was computed."""

    links: typing.ClassVar[dict[str, str]] = {}

    def __init__(self, **params: Any) -> None:
        self.params = params

    @classmethod
    def param_names(cls) -> list[str]:
        return list(keyword_params(cls.__init__))

    @classmethod
    def check_params(cls, params: dict[str, Any]) -> None:
        """Unknown or invalid parameters fail when the suite loads, not mid-run."""
        check_kwargs(cls.__init__, params)
        try:
            made = cls(**params)
        except (TypeError, ValueError):
            raise
        except Exception as err:   # e.g. a comparison a constructor was not written for
            raise ValueError(f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"
                             ) from None
        if "params" not in vars(made):   # its parameters would be missing from what wraps or records it
            names = ", ".join(f"{p}={p}" for p in cls.param_names())
            raise TypeError(f"{cls.__name__}.__init__ does not call super().__init__; add "
                            f"super().__init__({names}) before setting attributes")


def keyword_params(fn: Callable, skip: tuple[str, ...] = ("self",)) -> dict[str, inspect.Parameter]:
    return {p: v for p, v in inspect.signature(fn).parameters.items()
            if p not in skip and v.kind not in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)}


def check_kwargs(fn: Callable, params: dict[str, Any], skip: tuple[str, ...] = ("self",)) -> None:
    """TypeError/ValueError (one line, with the closest valid value) for an unknown name or a bad value."""
    known = keyword_params(fn, skip)
    try:
        hints = typing.get_type_hints(fn)
    except Exception:   # an annotation that does not resolve: fall back to the defaults alone
        hints = {}
    for key, value in params.items():
        if key not in known:
            close = difflib.get_close_matches(key, list(known), n=1)
            hint = f"did you mean '{close[0]}'?" if close else f"known: {', '.join(known) or 'none'}"
            raise TypeError(f"unknown parameter '{key}'; {hint}")
        default = known[key].default
        if default is None or default is inspect.Parameter.empty:
            _check_annotation(key, value, hints.get(key))
        check_value(key, value, default)


_NAMES = {float: "a number", int: "an integer", str: "a string", bool: "true or false", dict: "a table",
          list: "a list"}


def _check_annotation(key: str, value: Any, hint: Any) -> None:
    """For parameters defaulting to None: the value must have one of the annotation's plain types."""
    if hint is None:
        return
    args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    plain = [typing.get_origin(a) or a for a in args if a is not type(None)]
    if not plain or not all(a in _NAMES for a in plain):
        return
    for a in plain:
        if a is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return
        if a is int and isinstance(value, int) and not isinstance(value, bool):
            return
        if a not in (float, int) and isinstance(value, a):
            return
    raise TypeError(f"'{key}' must be {' or '.join(_NAMES[a] for a in plain)}, got {type(value).__name__} {value!r}")


def check_value(key: str, value: Any, default: Any = inspect.Parameter.empty) -> None:
    if isinstance(value, dict) and isinstance(default, (bool, int, float, str)):
        for k, item in value.items():   # a table of values (e.g. one per case) takes the default's type in each
            check_value(f"{key}.{k}", item, default)
        return
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise TypeError(f"'{key}' must be true or false, got {type(value).__name__} {value!r}")
    elif isinstance(default, int):
        if not isinstance(value, int) or isinstance(value, bool):
            near = f"; did you mean {round(value)}?" if isinstance(value, float) and math.isfinite(value) else ""
            raise TypeError(f"'{key}' must be an integer, got {type(value).__name__} {value!r}{near}")
    elif isinstance(default, float) and (not isinstance(value, (int, float)) or isinstance(value, bool)):
        raise TypeError(f"'{key}' must be a number, got {type(value).__name__} {value!r}")
    elif isinstance(default, str) and not isinstance(value, str):
        raise TypeError(f"'{key}' must be a string, got {type(value).__name__} {value!r}")
    check_plain(key, value)


def check_plain(key: str, value: Any) -> None:
    """Finite numbers and printable strings all the way down (lists and tables included)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"'{key}' must be finite, got {value}")
    if isinstance(value, str) and any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ValueError(f"'{key}' holds a control character ({value!r}); remove it")
    if isinstance(value, (list, tuple)):
        for item in value:
            check_plain(key, item)
    if isinstance(value, dict):
        for k, item in value.items():
            check_plain(f"{key}.{k}", item)
