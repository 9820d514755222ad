"""Scenario facts SenseCrypt and its Paillier baselines share: data categories, devices, budgets, round time.

Data categories (the ground truth that clustering is scored against) come from the
scenario's partition: with `k-classes` a client's category is the exact set of classes it
holds (every holder of a class gets all of its share, so the set is exact); with `iid`
every client is in one category; with `dirichlet` there is none (ARI is then not reported).

Device profiles follow section 4.1: within each data category the clients take, in index
order, the bandwidths 50, 45, 40, 35, 30 MBps and 24, 16, 12, 10, 8 CPUs (cycling when a
category has more than five clients, e.g. the 20 IID clients of the system scenario are
4 x 5); `none` and `statistical` give every client 50 MBps and 32 CPUs. Explicit lists
override the named setting.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

BANDWIDTHS_MBPS = (50.0, 45.0, 40.0, 35.0, 30.0)
CPUS = (24.0, 16.0, 12.0, 10.0, 8.0)
UNIFORM = (50.0, 32.0)
HETEROGENEITY = ("none", "system", "statistical", "both")


def for_scenario(value, fed, what: str):
    """A setting, or a table {scenario name: setting} with an optional "default".

    A suite gives every scenario the same defense params, so a setting that belongs to the
    scenario (its devices, its equal-fraction cap) is keyed by the scenario's name."""
    if not isinstance(value, dict):
        return value
    if fed.scenario.name in value:
        return value[fed.scenario.name]
    if "default" in value:
        return value["default"]
    raise ValueError(f"{what} has no entry for scenario '{fed.scenario.name}' and no 'default'; "
                     f"add one of: {', '.join(sorted(value))}")


def choices(value) -> list:
    """Every setting a plain value or a per-scenario table can resolve to (for validation)."""
    return list(value.values()) if isinstance(value, dict) else [value]


def data_groups(fed) -> list[int] | None:
    """Ground-truth category index per client, or None when the partition defines none."""
    scheme = fed.scenario.partition
    if scheme == "iid":
        return [0] * len(fed.clients)
    if scheme == "k-classes":
        ids: dict[tuple, int] = {}
        return [ids.setdefault(tuple(sorted(set(c.y.tolist()))), len(ids)) for c in fed.clients]
    return None


def check_heterogeneity(heterogeneity, bandwidths, cpus) -> None:
    for name in choices(heterogeneity):
        if name not in HETEROGENEITY:
            raise ValueError(f"heterogeneity '{name}' must be one of {', '.join(HETEROGENEITY)}")
    for label, table in (("bandwidths", bandwidths), ("cpus", cpus)):
        for values in choices(table):
            if values is not None and (not isinstance(values, list) or not values
                                       or any(not float(v) > 0 for v in values)):
                raise ValueError(f"{label} must be a non-empty list of positive numbers, got {values!r}")


def device_profiles(fed, heterogeneity: str, bandwidths=None, cpus=None) -> tuple[list[float], list[float]]:
    """Per-client bandwidth r_i (MBps) and CPU count v_i."""
    heterogeneity = for_scenario(heterogeneity, fed, "heterogeneity")
    bandwidths, cpus = for_scenario(bandwidths, fed, "bandwidths"), for_scenario(cpus, fed, "cpus")
    n = len(fed.clients)
    partition = fed.scenario.partition
    if heterogeneity in ("statistical", "both") and partition == "iid":
        raise ValueError(f"heterogeneity '{heterogeneity}' needs non-IID data, but the scenario's partition is "
                         f"iid; use partition = \"k-classes\" or heterogeneity = \"system\"")
    if heterogeneity == "system" and partition != "iid":
        raise ValueError(f"heterogeneity 'system' is the paper's IID-data scenario, but the partition is "
                         f"'{partition}'; use heterogeneity = \"both\"")
    if heterogeneity in ("system", "both"):
        groups = data_groups(fed) or list(range(n))
        seen: dict[int, int] = {}
        ranks = []
        for g in groups:  # position of the client within its category, in index order
            ranks.append(seen.get(g, 0))
            seen[g] = ranks[-1] + 1
        r = [BANDWIDTHS_MBPS[k % len(BANDWIDTHS_MBPS)] for k in ranks]
        v = [CPUS[k % len(CPUS)] for k in ranks]
    else:
        r, v = [UNIFORM[0]] * n, [UNIFORM[1]] * n
    for label, given in (("bandwidths", bandwidths), ("cpus", cpus)):
        if given is not None and len(given) != n:
            raise ValueError(f"{label} lists {len(given)} values for {n} clients; give one per client")
    return ([float(x) for x in bandwidths] if bandwidths is not None else r,
            [float(x) for x in cpus] if cpus is not None else v)


def budgets(r: list[float], v: list[float], scopes: list[int]) -> list[float]:
    """Section 3.2: max-abs scale r and v within each scope, take the lesser, scale again so the best is 1."""
    r_arr, v_arr, scope = np.asarray(r, float), np.asarray(v, float), np.asarray(scopes)
    alpha = np.zeros(len(r_arr))
    for s in np.unique(scope):
        idx = scope == s
        capability = np.minimum(r_arr[idx] / np.abs(r_arr[idx]).max(), v_arr[idx] / np.abs(v_arr[idx]).max())
        alpha[idx] = capability / np.abs(capability).max()
    return [float(a) for a in alpha]


@dataclass
class RoundClock:
    """Modelled client time per round: measured protection seconds scaled by CPU share, plus upload over bandwidth.

    Our single-process measurement stands for the fastest device (the most CPUs), so client i's
    protection time is measured * v_max / v_i; its upload takes len(upload) / (r_i MB/s). Local
    training, the same for every defense, is left out.
    """

    bandwidths: list[float]
    cpus: list[float]
    protect: dict[tuple[int, int], float] = field(default_factory=dict)
    uploads: dict[tuple[int, int], int] = field(default_factory=dict)

    def charge(self, round: int, client: int, seconds: float) -> None:
        if (round, client) not in self.uploads:  # counterfactual re-encodes of the attacked client are not charged
            self.protect[(round, client)] = self.protect.get((round, client), 0.0) + seconds

    def upload(self, round: int, client: int, nbytes: int) -> None:
        self.uploads.setdefault((round, client), int(nbytes))

    def client_time(self, round: int, client: int) -> float:
        scale = max(self.cpus) / self.cpus[client]
        return self.protect.get((round, client), 0.0) * scale + self.uploads[(round, client)] / (
            self.bandwidths[client] * 1e6)

    def summary(self) -> dict:
        """round_time_max_s: mean over rounds of the slowest client's time; round_time_mean_s: mean client time."""
        per_round: dict[int, list[float]] = {}
        for (rnd, client) in sorted(self.uploads):
            per_round.setdefault(rnd, []).append(self.client_time(rnd, client))
        if not per_round:
            return {}
        times = [t for ts in per_round.values() for t in ts]
        return {"round_time_max_s": float(np.mean([max(ts) for ts in per_round.values()])),
                "round_time_mean_s": float(np.mean(times))}

    def details(self) -> dict:
        per_client: dict[int, list[float]] = {}
        for (rnd, client) in sorted(self.uploads):
            per_client.setdefault(client, []).append(self.client_time(rnd, client))
        return {"bandwidths_mbps": list(self.bandwidths), "cpus": list(self.cpus),
                "client_time_s": {f"client-{c}": float(np.mean(ts)) for c, ts in per_client.items()}}
