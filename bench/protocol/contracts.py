"""What each kind of plugin promises, checked twice: when the plugin loads (bench/registry.py refuses one
that breaks its contract, with one line naming the fault and the fix) and where what a hook returns is
received (the engine, the cell scorer, the loaders). A misspelled hook would otherwise be a helper nobody
calls, and a plaintext row would be published as a defense; a wrong return type would be a raw error
deep in the engine that names neither the plugin nor what it should have returned.
"""
from __future__ import annotations

import difflib
import inspect
import numbers
from typing import Any

import numpy as np
import torch

from bench.protocol.attack import FAMILIES, THREAT_MODELS, Attack, Reconstruction
from bench.protocol.configurable import keyword_params
from bench.protocol.aggregation import Aggregation
from bench.protocol.defense import KEY_TOPOLOGIES, Defense
from bench.protocol.evidence import KINDS, Metric
from bench.protocol.records import dp_fault
from bench.protocol.wire import Party, Payload
from bench.registry import ATTACKS, DATASETS, DEFENSES, METRICS, MODELS


class ContractError(TypeError):
    """A plugin's hook returned what its contract does not allow; str() names the plugin and the type expected."""


# hook -> (positional arguments its caller passes, keyword arguments); the calls of bench/federation/engine.py,
# bench/federation/budget.py, bench/run/cells.py and bench/run/preflight.py
DEFENSE_HOOKS = {"applicable": (("setting",), ()), "adapt_model": (("model",), ()), "setup": (("fed",), ()),
                 "local_gradient": (("fed", "client", "model", "x", "y"), ()),
                 "round_start": (("fed", "round", "clients", "updates"), ()),
                 "encode": (("fed", "client", "update", "weight"), ()),
                 "aggregate": (("fed", "uploads", "server"), ()), "start_aggregate": (("fed", "server"), ()),
                 "decoder": (("fed",), ()),
                 "decode": (("fed", "aggregate", "party"), ()), "merge": (("fed", "client", "global_update"), ()),
                 "run_metrics": (("fed",), ()), "cipher_target": ((), ()), "match_cipher_bytes": (("nbytes",), ())}
UPLOAD_HOOKS = ("encode", "adapt_model")   # the hooks that can change what a client uploads
ATTACK_HOOKS = {"applicable": (("setting",), ()), "blocked": (("view", "knowledge"), ()),
                "run": (("view", "knowledge"), ("seed",)), "modify_model": (("model", "knowledge"), ())}


def check_defense(obj: Any) -> str | None:
    """The fault of a defense plugin and its fix, or None."""
    if not (isinstance(obj, type) and issubclass(obj, Defense)):
        return f"{_name(obj)} does not derive from bench.Defense; declare it `class {_name(obj)}(bench.Defense)`"
    fault = _class_fault(obj, Defense, DEFENSE_HOOKS)
    if fault is not None:
        return fault
    if obj.key_topology not in KEY_TOPOLOGIES:
        return f"{obj.__name__}.key_topology is {obj.key_topology!r}; set one of {', '.join(KEY_TOPOLOGIES)}"
    for flag in ("decodes_weighted_sum", "uploads_weights", "reference_row", "trains", "differentially_private"):
        if not isinstance(getattr(obj, flag), bool):
            return f"{obj.__name__}.{flag} is {getattr(obj, flag)!r}; set True or False"
    if not any(getattr(obj, h) is not getattr(Defense, h) for h in UPLOAD_HOOKS) and not vars(obj).get("reference_row"):
        return (f"{obj.__name__} overrides neither encode nor adapt_model, so clients upload what plaintext FedAvg "
                f"uploads; implement encode(self, fed, client, update, weight) -> bench.Payload, or set "
                f"reference_row = True if it is a row to compare against")
    return None


def check_attack(obj: Any) -> str | None:
    """The fault of an attack plugin and its fix, or None."""
    if not (isinstance(obj, type) and issubclass(obj, Attack)):
        return f"{_name(obj)} does not derive from bench.Attack; declare it `class {_name(obj)}(bench.Attack)`"
    fault = _class_fault(obj, Attack, ATTACK_HOOKS)
    if fault is not None:
        return fault
    if obj.family not in FAMILIES:
        return f"{obj.__name__}.family is {obj.family!r}; set one of {', '.join(FAMILIES)}"
    if not isinstance(obj.needs_membership, bool):
        return f"{obj.__name__}.needs_membership is {obj.needs_membership!r}; set True or False"
    if obj.threat_model not in THREAT_MODELS:
        return f"{obj.__name__}.threat_model is {obj.threat_model!r}; set one of {', '.join(THREAT_MODELS)}"
    modifies = obj.modify_model is not Attack.modify_model
    if obj.threat_model == "malicious-model" and not modifies:
        return (f"{obj.__name__} declares threat_model 'malicious-model' but does not override modify_model; "
                f"implement modify_model(self, model, knowledge) -> torch.nn.Module")
    if obj.threat_model == "passive" and modifies:
        return (f"{obj.__name__} overrides modify_model, which the engine calls only for a malicious server; "
                f"set threat_model = 'malicious-model'")
    return None


def check_metric(obj: Any) -> str | None:
    """A metric entry point names a bench.Metric, the module that registers it, or a @bench.metric function."""
    if not isinstance(obj, Metric):
        return (f"{_name(obj)} is not a registered metric; decorate the function with @bench.metric(name, unit, "
                f"lower_is_better, kind, description) or point the entry point at its module")
    if obj.kind not in KINDS:
        return f"metric '{obj.name}' has kind {obj.kind!r}; use one of {', '.join(KINDS)}"
    if obj.lower_is_better not in (True, False, None):
        return f"metric '{obj.name}' has lower_is_better {obj.lower_is_better!r}; use True, False or None"
    return _call_fault(obj.compute, "compute", ("evidence",), (), f"def {_name(obj.compute)}(ev: bench.Evidence)")


def check_dataset(obj: Any) -> str | None:
    """A dataset is a loader called as loader(data_root, seed, seq_len) that returns a bench.Dataset."""
    if not callable(obj):
        return f"{_name(obj)} is not callable; register a function loader(data_root, seed, seq_len) -> bench.Dataset"
    return _call_fault(obj, _name(obj), ("data_root", "seed", "seq_len"), (),
                       "def loader(data_root, seed, seq_len) -> bench.Dataset")


def check_model(obj: Any) -> str | None:
    """A model is a factory called as factory(data, **model_params) that returns a torch.nn.Module."""
    if not callable(obj):
        return f"{_name(obj)} is not callable; register a function factory(data, **params) -> torch.nn.Module"
    try:
        first = next(iter(inspect.signature(obj).parameters), None)
    except ValueError:   # no signature to read (a builtin): nothing to check
        return None
    return _defaults_fault(obj, _name(obj), (first,)) or \
        _call_fault(obj, _name(obj), ("data",), (), "def factory(data, width: int = 64) -> torch.nn.Module")


# -- where a hook's result is received --------------------------------------------------------------------
def describe(component: Any) -> str:
    """'defense 'x' (plugin dist 1.0, entry point ...)' for a registered object or an instance of one."""
    for registry in (DEFENSES, ATTACKS, METRICS, DATASETS, MODELS):
        entry = registry.entry_of(component)
        if entry is not None:
            where = f" ({entry.origin.label})" if entry.origin is not None else ""
            return f"{registry.singular} '{entry.name}'{where}"
    return _name(component if isinstance(component, type) or callable(component) else type(component))


def returned(component: Any, hook: str, value: Any, expected: type | tuple, what: str) -> Any:
    """`value` when it is an `expected`; else a ContractError naming the plugin, the hook and `what` it owes."""
    if isinstance(value, expected):
        return value
    raise ContractError(f"{describe(component)}: {hook} returned {_typename(value)}, expected {what}")


def returned_reason(component: Any, hook: str, value: Any) -> str | None:
    return returned(component, hook, value, (str, type(None)), "None or a one-line reason (str)")


def returned_update(defense: Any, value: Any, shapes: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """decode's result: one tensor of the parameter's shape for every entry of the update."""
    returned(defense, "decode", value, dict, "a dict of parameter name -> torch.Tensor (one per entry of fed.names)")
    for name, shape in shapes.items():
        tensor = value.get(name)
        if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != tuple(shape):
            got = "nothing" if tensor is None else f"{_typename(tensor)} {tuple(getattr(tensor, 'shape', ()))}"
            raise ContractError(f"{describe(defense)}: decode returned {got} for '{name}', expected a torch.Tensor "
                                f"of shape {tuple(shape)} for every entry of fed.names")
    return value


def returned_payload(defense: Any, hook: str, value: Any) -> Payload:
    return returned(defense, hook, value, Payload, "a bench.Payload (plaintext entries: bench.dense_payload(update))")


def returned_loss(defense: Any, value: Any) -> torch.Tensor:
    """local_gradient's result: the batch's loss, a one-element tensor."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.detach()
    raise ContractError(f"{describe(defense)}: local_gradient returned {_typename(value)}, expected the batch's loss "
                        f"as a one-element torch.Tensor (the default returns fed.backward(model, x, y))")


def returned_aggregation(defense: Any, value: Any) -> Aggregation | None:
    return returned(defense, "start_aggregate", value, (Aggregation, type(None)),
                    "a bench.Aggregation (fold(upload), result() -> bench.Payload) or None")


def returned_party(defense: Any, value: Any) -> Party:
    return returned(defense, "decoder", value, Party, "a bench.Party (e.g. fed.parties['key-server'])")


def returned_model(component: Any, hook: str, value: Any) -> torch.nn.Module:
    return returned(component, hook, value, torch.nn.Module, "a torch.nn.Module")


def returned_reconstruction(attack: Any, value: Any) -> Reconstruction:
    return returned(attack, "run", value, Reconstruction, "a bench.Reconstruction")


def metric_value(metric: Metric, value: Any) -> Any:
    """A metric's value: a number, "unavailable: <reason>", or None where it does not apply."""
    if value is None or isinstance(value, (str, bool, np.bool_, numbers.Real)):
        return value
    raise ContractError(f"{describe(metric)}: compute returned {_typename(value)}, expected a number, "
                        f"None (does not apply) or 'unavailable: <reason>'")


def run_metric_values(defense: Any, values: Any) -> dict[str, Any]:
    """What run_metrics returned: registered run metrics by name (numbers), and dicts kept as record details."""
    returned(defense, "run_metrics", values, dict, "a dict of run metric name -> number")
    for name, value in values.items():
        if isinstance(value, dict):
            continue
        if name not in METRICS or METRICS.get(name).per_target:
            raise ContractError(
                f"{describe(defense)}: run_metrics returned '{name}', which is no registered run metric; register "
                f"it in the defense's module with bench.run_metric('{name}', unit, lower_is_better, kind, "
                f"description), or return it inside a dict to keep it in the record's details")
        if not (value is None or isinstance(value, (str, bool, np.bool_, numbers.Real))):
            raise ContractError(f"{describe(defense)}: run_metrics returned {_typename(value)} for '{name}', "
                                f"expected a number")
    if getattr(defense, "differentially_private", False) and dp_fault(values.get("epsilon"), values.get("dp")):
        raise ContractError(f"{describe(defense)} declares differentially_private but its run_metrics "
                            f"{dp_fault(values.get('epsilon'), values.get('dp'))}; report its accountant's epsilon and "
                            f"details as DP-FedAvg does (defenses/dp.py)")
    return values


# -- shared checks ------------------------------------------------------------------------------------------
def _class_fault(cls: type, base: type, hooks: dict[str, tuple[tuple[str, ...], tuple[str, ...]]]) -> str | None:
    if inspect.isabstract(cls):
        missing = ", ".join(sorted(cls.__abstractmethods__))
        return f"{cls.__name__} does not implement {missing} of bench.{base.__name__}"
    for hook, (args, kwargs) in hooks.items():
        if getattr(cls, hook) is getattr(base, hook):
            continue
        params = ", ".join(("self",) + args + tuple(f"{k}=..." for k in kwargs))
        fault = _call_fault(inspect.getattr_static(cls, hook), f"{cls.__name__}.{hook}", ("self",) + args, kwargs,
                            f"def {hook}({params})")
        if fault is not None:
            return fault
    own = {name for klass in cls.__mro__[:cls.__mro__.index(base)] for name, value in vars(klass).items()
           if not name.startswith("_") and callable(value) and name not in hooks and not hasattr(base, name)}
    idle = [h for h in hooks if getattr(cls, h) is getattr(base, h)]
    for name in sorted(own):
        close = [h for h in idle if name.startswith(h + "_")] or difflib.get_close_matches(name, idle, n=1)
        if close:
            return (f"{cls.__name__}.{name} is no hook of bench.{base.__name__}; did you mean `{close[0]}`? "
                    f"(rename it, or start a helper's name with _)")
    return _defaults_fault(cls.__init__, f"{cls.__name__}.__init__", ("self",))


def _call_fault(fn: Any, where: str, args: tuple[str, ...], kwargs: tuple[str, ...], fix: str) -> str | None:
    """The fault when `fn` cannot be called with `args` positionally and `kwargs` by name."""
    if isinstance(fn, (staticmethod, classmethod)):
        fn, args = fn.__func__, args[1:] if isinstance(fn, staticmethod) else ("cls",) + args[1:]
    if not callable(fn):
        return f"{where} is {_typename(fn)}, not a function; use `{fix}`"
    try:
        inspect.signature(fn).bind(*args, **{k: None for k in kwargs})
    except TypeError:
        return f"{where}{inspect.signature(fn)} cannot be called as {', '.join(args + kwargs)}; use `{fix}`"
    except ValueError:   # no signature to read (a builtin): nothing to check
        return None
    return None


def _defaults_fault(fn: Any, where: str, skip: tuple) -> str | None:
    """Parameters a suite sets by name must be keywords with defaults (their type is the default's)."""
    for name, param in keyword_params(fn, skip).items():
        if param.default is inspect.Parameter.empty:
            return f"{where} parameter '{name}' has no default; give it one (suites set parameters by name)"
    return None


def _name(obj: Any) -> str:
    return getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or type(obj).__name__


def _typename(value: Any) -> str:
    return "None" if value is None else type(value).__name__
