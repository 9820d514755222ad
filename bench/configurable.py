"""Shared base of defenses and attacks: keyword parameters checked when a suite loads."""
from __future__ import annotations

import difflib
import inspect
from typing import Any


class Configurable:
    """Subclasses declare their parameters as keyword arguments of __init__ with defaults."""

    def __init__(self, **params: Any) -> None:
        self.params = params

    @classmethod
    def param_names(cls) -> list[str]:
        sig = inspect.signature(cls.__init__)
        return [p for p, v in sig.parameters.items()
                if p != "self" and v.kind not in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)]

    @classmethod
    def check_params(cls, params: dict[str, Any]) -> None:
        """Unknown or invalid parameters fail when the suite loads, not mid-run."""
        known = cls.param_names()
        for key in params:
            if key not in known:
                close = difflib.get_close_matches(key, known, n=1)
                hint = f"did you mean '{close[0]}'?" if close else f"known: {', '.join(known) or 'none'}"
                raise TypeError(f"unknown parameter '{key}'; {hint}")
        cls(**params)
