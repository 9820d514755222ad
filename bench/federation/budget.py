"""Budget matching: a selective defense encrypts as much as a reference defense's ciphertexts cost.

Papers compare selective encryption "at the same HE overhead" (SHE-LoRA section 4.4: MaskCrypt
at SHE-LoRA's ciphertext size, and figure 9's sweep of their ratio). A defense that supports it
takes `match_bytes` (the reference's label, e.g. "she-lora(budget=0.003)") and `bytes_ratio`; before
its run the harness federates the reference on the same scenario, reads the mean ciphertext bytes
of its aggregated uploads (real serialized ciphertexts), and hands the defense ratio times that
through `Defense.match_cipher_bytes`. The reference run is cached per process and scenario.
"""
from __future__ import annotations

import ast
import dataclasses
import json
import re

LABEL_RE = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._+-]*)\s*(?:\((.*)\))?\s*")


def _value(text: str):
    text = text.strip()
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text          # a bare word, as labels print strings (rule=max)


def parse_label(label: str) -> tuple[str, dict]:
    """'name(k=v, ...)' as Component.label writes it -> (name, params); ValueError names the fault."""
    from bench.registry import DEFENSES

    m = LABEL_RE.fullmatch(label) if isinstance(label, str) else None
    if m is None:
        raise ValueError(f"match_bytes {label!r} is not a defense label like 'she-lora(budget=0.003)'")
    name, inner = m.group(1), m.group(2)
    if name not in DEFENSES:
        raise ValueError(f"match_bytes names defense '{name}', which is not registered; known: "
                         f"{', '.join(DEFENSES.names())}")
    params = {}
    for item in filter(None, (s.strip() for s in (inner or "").split(","))):
        key, sep, val = item.partition("=")
        if not sep or not key.strip().isidentifier():
            raise ValueError(f"match_bytes {label!r}: '{item}' is not key=value")
        params[key.strip()] = _value(val)
    DEFENSES.get(name).check_params(params)
    return name, params


def check_target(match_bytes: str | None, bytes_ratio: float) -> None:
    """Load-time check of a defense's budget-matching parameters."""
    if not isinstance(bytes_ratio, (int, float)) or isinstance(bytes_ratio, bool) or not bytes_ratio > 0:
        raise ValueError(f"bytes_ratio must be a number > 0, got {bytes_ratio!r}")
    if match_bytes is not None:
        parse_label(match_bytes)


_REFERENCE: dict[tuple[str, str, str | None], float] = {}


def _reference_bytes(sc, label: str, data_root: str | None) -> float:
    from bench.data.loading import load_dataset, resolve_data_root
    from bench.federation.engine import run_federation
    from bench.registry import DEFENSES

    key = (json.dumps(dataclasses.asdict(sc), sort_keys=True, default=str), label, data_root)
    if key in _REFERENCE:
        return _REFERENCE[key]
    name, params = parse_label(label)
    data = load_dataset(sc.dataset, resolve_data_root(data_root), max_train=sc.max_train, max_test=sc.max_test,
                        seed=sc.seed, seq_len=sc.seq_len)
    run = run_federation(sc, data, DEFENSES.get(name)(**params))
    nbytes = float(run.metrics.get("ciphertext_bytes", 0.0))
    if nbytes <= 0:
        raise ValueError(f"reference defense '{label}' sends no ciphertext in scenario '{sc.name}', so there is no "
                         f"budget to match; give it an encrypted amount")
    _REFERENCE[key] = nbytes
    return nbytes


def apply_budget(defense, scenario, data_root: str | None) -> float | None:
    """Set a budget-matched defense's encrypted amount; returns the target bytes (None when not matched)."""
    target = defense.cipher_target()
    if target is None:
        return None
    label, ratio = target
    nbytes = ratio * _reference_bytes(scenario, label, data_root)
    defense.match_cipher_bytes(nbytes)
    return nbytes
