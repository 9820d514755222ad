"""Built-in attacks, one package per family: every module here registers what it defines (bench.registry
discovers them). dager/ (text from transformer gradients), gradient/ (DLG, iDLG, Inverting Gradients, SPEAR),
labels/ (iLRG, LLG+, the label baselines, negotiation maps), mia/ (membership), audit/ (canary audits, trials or one run),
server/ (a malicious server that modifies the model it sends).

The flat module paths of the previous release (attacks.dager_span, attacks.ilrg, ...) still import, with a
DeprecationWarning, until the next release: MOVED maps each to its module in the rooms.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

MOVED = {
    **{f"attacks.dager_{n}": f"attacks.dager.{n}"
       for n in ("arch", "decoder", "hidden", "layer1", "layouts", "llama", "noise", "search", "span")},
    **{f"attacks.{n}": f"attacks.gradient.{n}" for n in ("dlg", "idlg", "inversion", "inverting_gradients")},
    **{f"attacks.{n}": f"attacks.labels.{n}" for n in ("ilrg", "baselines", "negotiation")},
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old path as a module holding the new module's names (the same objects)."""

    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name in MOVED else None

    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        new = MOVED[module.__name__]
        warnings.warn(f"{module.__name__} moved to {new}; the old path goes in the next release",
                      DeprecationWarning, stacklevel=2)
        module.__dict__.update({k: v for k, v in vars(importlib.import_module(new)).items()
                                if k not in ("__name__", "__spec__", "__loader__", "__path__", "__file__")})


if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
    sys.meta_path.append(_MovedModules())
