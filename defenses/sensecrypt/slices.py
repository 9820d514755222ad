"""Per-parameter Paillier measured on a slice and extrapolated, where encrypting every value cannot run.

Why: python-paillier takes ~1.5 ms (1024-bit key) to ~11 ms (2048-bit) per value on these cores, so the
Paillier baseline on a 124,534-parameter AlexNet (20 clients) or SenseCrypt's masks on an 11.2 M-parameter
ResNet-18 would take hours to days per round.

Cost model: one ciphertext per value, and every Paillier operation costs the same whatever the value,
so each cost is linear in the number of values it touches:
    client encryption   T_enc(k) = k * t_enc,  ciphertext bytes B(k) = k * b    (k values encrypted)
    server aggregation  T_agg(u) = u * t_agg                                      (u aggregated entries)
    key-server decrypt  T_dec(u) = u * t_dec
The per-value costs are measured in every call on real ciphertexts of a slice: the first `size` values a
client encrypts (CPU seconds of the real encryption, len() of the real blobs), the first `size`
entries the aggregation server sums (its real additions and encryptions), and their real decryption.
Each call's extrapolation is its own slice's time scaled by total / slice. The pages check the model
against full encryptions of other sizes.

Slice mode on the wire: only the slice travels as ciphertext. The rest of what the protocol encrypts is
withheld: the aggregation server receives it in no form (to its view the entries are hidden, as under a
ciphertext) and the simulation hands the key server the values decryption would give; the key server
checks its real decryption of the slice against them. The engine's measured he_* seconds, ciphertext and
upload bytes then describe the slice only, so a sliced defense reports them as absent and reports the
*_extrapolated metrics instead (never mixed with measured ones).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench.crypto import clock
from bench.protocol.evidence import run_metric

# The extrapolated costs: separate names so they are never read as measured values.
for _name, _unit, _desc, _fmt in [
    ("he_encrypt_extrapolated_s", "s", "client encryption time per upload (CPU seconds), extrapolated from a measured slice", "{:.2f}"),
    ("he_aggregate_extrapolated_s", "s", "server homomorphic aggregation time per round, extrapolated from a measured "
     "slice", "{:.2f}"),
    ("he_decrypt_extrapolated_s", "s", "decryption time per round, extrapolated from a measured slice", "{:.2f}"),
    ("ciphertext_bytes_extrapolated", "B", "ciphertext bytes per client upload, extrapolated from a measured slice",
     "{:,.0f}"),
    ("upload_bytes_extrapolated", "B", "bytes one client sends per round, its ciphertexts extrapolated from a measured "
     "slice", "{:,.0f}"),
    ("round_time_max_extrapolated_s", "s", "modelled round time (round_time_max_s) with the encryption seconds and "
     "bytes extrapolated from a measured slice", "{:.2f}"),
    ("round_time_mean_extrapolated_s", "s", "modelled client time per round (round_time_mean_s) with the encryption "
     "seconds and bytes extrapolated from a measured slice", "{:.2f}"),
]:
    run_metric(_name, _unit, True, "cost", _desc, fmt=_fmt, timing=_unit == "s")
run_metric("encrypted_fraction_extrapolated", "", None, "cost", "fraction of update entries the protocol encrypts "
           "where the wire carries only a measured slice of them (encrypted_fraction is then the slice's)")

# measured metrics a sliced run must not report: the engine would fill them from the slice alone
MEASURED = ("he_encrypt_s", "he_aggregate_s", "he_decrypt_s", "ciphertext_bytes", "upload_bytes")
TOLERANCE = 1e-6   # |real decryption - simulated value| allowed (fixed point at 2^-40, sums of a few clients)


@dataclass
class SliceCosts:
    """Per-call measurements on slices and their linear extrapolations."""

    size: int
    measured: dict[str, list[float]] = field(default_factory=lambda: defaultdict(lambda: [0.0, 0.0]))
    extrapolated: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    max_error: float = 0.0
    # the simulation's channel to the key server (module docstring): never part of an upload or a view
    withheld: dict[bytes, Any] = field(default_factory=dict)    # first blob of an upload -> its unsent values
    simulated: dict[Any, np.ndarray] = field(default_factory=dict)   # cluster -> what decrypting it all gives

    def __post_init__(self) -> None:
        if not isinstance(self.size, int) or self.size < 1:
            raise ValueError(f"paillier_slice must be an int >= 1 (or 0 for no slicing), got {self.size!r}")

    def take(self, total: int) -> int:
        return min(self.size, total)

    def record(self, metric: str, amount: float, sliced: int, total: int, keep: bool = True) -> float:
        """One call: `amount` (seconds or bytes) measured on `sliced` values; returns its extrapolation to
        `total`, also kept as one value of the metric unless keep=False (then `note` a sum of several)."""
        if sliced <= 0:
            value = 0.0
        else:
            self.measured[metric][0] += amount
            self.measured[metric][1] += sliced
            value = amount * total / sliced
        if keep:
            self.note(metric, value)
        return value

    def note(self, metric: str, value: float) -> None:
        self.extrapolated[metric].append(value)

    def check(self, real: np.ndarray, simulated: np.ndarray, where: str) -> None:
        """The key server's real decryption of the slice must equal what the simulation hands it."""
        if real.size:
            error = float(np.max(np.abs(real - simulated)))
            self.max_error = max(self.max_error, error)
            if not error <= TOLERANCE:
                raise RuntimeError(f"{where}: decrypted slice differs from the simulated values by {error:.2e}")

    def metrics(self) -> dict[str, Any]:
        out: dict[str, Any] = {f"{m}_extrapolated" + ("" if m.endswith("bytes") else "_s"): float(np.mean(v))
                               for m, v in self.extrapolated.items() if v}
        out.update({m: None for m in MEASURED})
        per_value = {m: s / n for m, (s, n) in self.measured.items() if n}
        out["paillier_slice"] = {"slice": self.size, "per_value": per_value,
                                 "measured_values": {m: n for m, (_, n) in self.measured.items()},
                                 "max_decryption_error": self.max_error,
                                 "model": "linear in values: one Paillier ciphertext per value"}
        return out


def timed(fn, *args):
    """(result, CPU seconds) of one real call (bench/crypto/clock.py: what the machine's load does not move)."""
    result, spent = clock.timed(fn, *args)
    return result, spent.cpu


def prefix_mask(mask: np.ndarray, count: int) -> np.ndarray:
    """The first `count` True positions of a flat mask."""
    out = np.zeros(mask.size, bool)
    out[np.flatnonzero(mask)[:count]] = True
    return out
