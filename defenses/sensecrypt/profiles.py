"""Scenario facts SenseCrypt and its Paillier baselines share: data categories, devices, budgets, round time.

Data categories (the ground truth that clustering is scored against) come from the
scenario's partition: with `k-classes` a client's category is the exact set of classes it
holds (every holder of a class gets all of its share, so the set is exact); with `iid`
every client is in one category; with `dirichlet` there is none (ARI is then not reported).

Devices are scenario data (bench/federation/client_devices.py): section 4.1's system heterogeneity is the
`sensecrypt-4.1` catalog assigned `by-category` (within each data category the clients take,
in index order, 50, 45, 40, 35, 30 MBps and 24, 16, 12, 10, 8 CPUs, cycling when a category has
more than five clients); its homogeneous setting is the `uniform` catalog (50 MBps, 32 CPUs).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from bench.federation import client_devices


def data_groups(fed) -> list[int] | None:
    """Ground-truth category index per client, or None when the partition defines none."""
    return client_devices.data_groups([c.y for c in fed.clients], fed.scenario.partition)


def device_profiles(fed) -> tuple[list[float], list[float]]:
    """Per-client bandwidth r_i (MBps) and CPU count v_i: the scenario's devices."""
    return ([float(c.device.bandwidth_mbps) for c in fed.clients], [float(c.device.cpus) for c in fed.clients])


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

    Protection seconds are CPU seconds (bench/crypto/clock.py), so other processes on the machine do not move them.
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
