"""Device profiles as scenario data: which device each client runs on.

A device type carries what the defenses of the seed papers size themselves by: upload
bandwidth (MB/s), a CPU share (cores for SenseCrypt, GFLOPS for SHE-LoRA; only ratios
matter), an HE budget (the fraction of its update the device affords to encrypt, SHE-LoRA's
gamma_i; 1.0 = no limit) and a LoRA rank (None = the model's own rank). A scenario names a
catalog (`devices`) and how its clients take the types (`device_assign`), or lists one type
per client (`device_types`); defenses read `client.device`, never a scenario's name.

Catalogs:
- uniform: one device, 50 MB/s and 32 CPUs (SenseCrypt section 4.1's homogeneous setting).
- sensecrypt-4.1: the five tiers of SenseCrypt section 4.1, 50/45/40/35/30 MB/s with
  24/16/12/10/8 CPUs.
- sensecrypt-fig6: SenseCrypt Fig. 6 (extreme system heterogeneity): 32, 24, 16, 12, 10, 8, 2 and 1
  CPUs at 50 MB/s, and a ninth device that trains without HE (32 CPUs, HE budget 0).
- she-lora-bert / she-lora-llama: SHE-LoRA table 1, four types with 105.2 / 165.5 / 216.9 /
  243.1 GFLOPS, ranks 8 / 16 / 16 / 32, budgets 0.4 / 0.4 / 0.8 / 1.6 % (Bert-Large) or
  0.125 / 0.125 / 0.25 / 0.5 % (OpenLLaMA-3B), in the mix 20:15:10:5. The paper gives no
  bandwidth; every type gets 50 MB/s.

Assignment:
- cycle: client i takes type i mod T (catalog order).
- by-category: within each data category, clients take the types in index order (SenseCrypt
  section 4.1: every category spans the tiers). Categories are the exact label sets under
  `k-classes`, one category under `iid`; `dirichlet` has none, so clients cycle by index.
- mix: the catalog's own proportions (SHE-LoRA's 20:15:10:5), largest remainder, weakest first.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Device:
    type: str
    bandwidth_mbps: float
    cpus: float
    he_budget: float = 1.0
    lora_rank: int | None = None


def _she_lora(budgets: tuple[float, ...]) -> dict[str, tuple[Device, int]]:
    gflops, ranks, counts = (105.2, 165.5, 216.9, 243.1), (8, 16, 16, 32), (20, 15, 10, 5)
    return {f"type-{i + 1}": (Device(f"type-{i + 1}", 50.0, gflops[i], budgets[i], ranks[i]), counts[i])
            for i in range(4)}


# name -> {type: (device, share in the catalog's mix)}
CATALOGS: dict[str, dict[str, tuple[Device, int]]] = {
    "uniform": {"uniform": (Device("uniform", 50.0, 32.0), 1)},
    "sensecrypt-4.1": {f"tier-{i + 1}": (Device(f"tier-{i + 1}", bw, cpu), 1)
                       for i, (bw, cpu) in enumerate(zip((50.0, 45.0, 40.0, 35.0, 30.0), (24.0, 16.0, 12.0, 10.0, 8.0)))},
    "sensecrypt-fig6": {f"cpu-{c}": (Device(f"cpu-{c}", 50.0, float(c)), 1) for c in (32, 24, 16, 12, 10, 8, 2, 1)}
    | {"no-he": (Device("no-he", 50.0, 32.0, he_budget=0.0), 1)},
    "she-lora-bert": _she_lora((0.004, 0.004, 0.008, 0.016)),
    "she-lora-llama": _she_lora((0.00125, 0.00125, 0.0025, 0.005)),
}
ASSIGN = ("cycle", "by-category", "mix")


def check(catalog: str, assign: str, types: list | None, num_clients: int) -> None:
    """Raise ValueError with the fix when a scenario's device settings cannot be resolved."""
    import difflib
    if catalog not in CATALOGS:
        close = difflib.get_close_matches(catalog, list(CATALOGS), n=1)
        raise ValueError(f"devices '{catalog}' is not a catalog; "
                         + (f"did you mean '{close[0]}'?" if close else f"choose one of {', '.join(CATALOGS)}"))
    if assign not in ASSIGN:
        raise ValueError(f"device_assign '{assign}' must be one of {', '.join(ASSIGN)}")
    if types is not None:
        if len(types) != num_clients:
            raise ValueError(f"device_types lists {len(types)} types for {num_clients} clients; give one per client")
        bad = [t for t in types if t not in CATALOGS[catalog]]
        if bad:
            raise ValueError(f"device_types: '{bad[0]}' is not a type of '{catalog}'; "
                             f"choose from {', '.join(CATALOGS[catalog])}")


def data_groups(labels: list, partition: str) -> list[int] | None:
    """Ground-truth data category per client (its exact label set under k-classes), None under dirichlet."""
    if partition == "iid":
        return [0] * len(labels)
    if partition == "k-classes":
        ids: dict[tuple, int] = {}
        return [ids.setdefault(tuple(sorted(set(np.asarray(y).ravel().tolist()))), len(ids)) for y in labels]
    return None


def _mix(counts: list[int], n: int) -> list[int]:
    quota = np.asarray(counts, float) * n / sum(counts)
    take = np.floor(quota).astype(int)
    for k in np.argsort(-(quota - take), kind="stable")[: n - take.sum()]:
        take[k] += 1
    return [k for k, c in enumerate(take) for _ in range(c)]


def assign(scenario, labels: list) -> list[Device]:
    """One device per client from the scenario's catalog, assignment rule or explicit list."""
    catalog = CATALOGS[scenario.devices]
    devices = [d for d, _ in catalog.values()]
    n = len(labels)
    if scenario.device_types is not None:
        return [catalog[t][0] for t in scenario.device_types]
    if scenario.device_assign == "mix":
        return [devices[k] for k in _mix([c for _, c in catalog.values()], n)]
    groups = data_groups(labels, scenario.partition) if scenario.device_assign == "by-category" else None
    if groups is None:
        return [devices[i % len(devices)] for i in range(n)]
    seen: dict[int, int] = {}
    out = []
    for g in groups:
        out.append(devices[seen.get(g, 0) % len(devices)])
        seen[g] = seen.get(g, 0) + 1
    return out
