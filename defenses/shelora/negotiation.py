"""HE subset negotiation (section 3.1.2, appendix D.1) over order-preserving encryption.

Clients share an OPE key (pyope, Boldyreva et al.'s scheme) beside the HE key. Each client
sends, per layer, its wanted columns G_i and their sensitivities S_i as OPE ciphertexts; the
server sees equal positions as equal ciphertexts and the order of sensitivities, nothing else.
It builds the Common list (columns by how many clients want them) and the Sensitivity list
(columns by their highest sensitivity), then Algorithm 1: clients grouped by budget k in
ascending order; each group adds lambda = k - |Res| columns, from its one client's G_i when
the group is a single client, else floor(a*lambda) from the group's own columns (ranked by
their least sensitivity across the group), floor(b*lambda) from Common and the rest from
Sensitivity. Choices: (a, b) by an exhaustive grid of step 0.1 instead of Bayesian
optimization (the same objective, min-Coverage - max-Risk, on a 66-point space); Risk weighs a
column by its rank in the Sensitivity list, since sums of OPE ciphertexts mean nothing.
The result is one ordered list of OPE ciphertexts per layer; each client decrypts it and
encrypts its first k_i columns.
"""
from __future__ import annotations

import numpy as np
from pyope.ope import OPE, ValueRange

POSITIONS = ValueRange(0, 2 ** 16 - 1)
SCORES = ValueRange(0, 2 ** 31 - 1)
OUT = ValueRange(0, 2 ** 47 - 1)
SCORE_SCALE = 1e6   # sensitivities are quantized to 1e-6 before OPE


class OrderCipher:
    """A client's OPE for positions and for quantized sensitivities (one shared key, two domains)."""

    def __init__(self, key: bytes):
        self.pos = OPE(key, in_range=POSITIONS, out_range=OUT)
        self.score = OPE(key, in_range=SCORES, out_range=OUT)

    def positions(self, cols) -> list[int]:
        return [self.pos.encrypt(int(j)) for j in cols]

    def scores(self, values) -> list[int]:
        return [self.score.encrypt(int(min(SCORES.end, round(float(v) * SCORE_SCALE)))) for v in values]

    def open_positions(self, cts) -> list[int]:
        return [self.pos.decrypt(int(c)) for c in cts]


def encode_message(positions: list[int], scores: list[int]) -> bytes:
    """(G_i, S_i) as it travels: pairs of 8-byte big-endian OPE ciphertexts."""
    return np.asarray([positions, scores], dtype=">u8").T.tobytes()


def decode_message(blob: bytes) -> tuple[list[int], list[int]]:
    pairs = np.frombuffer(blob, dtype=">u8").reshape(-1, 2)
    return [int(p) for p in pairs[:, 0]], [int(s) for s in pairs[:, 1]]


def negotiate(requests: list[tuple[int, list[int], list[int]]], grid: float = 0.1) -> list[int]:
    """Server side of Algorithm 1. requests: (k_i, OPE positions G_i, OPE scores S_i) per client.
    Returns the global ordered list of OPE positions, as long as the largest budget allows."""
    common: dict[int, int] = {}
    best: dict[int, int] = {}
    for _, g, s in requests:
        for p, v in zip(g, s):
            common[p] = common.get(p, 0) + 1
            best[p] = max(best.get(p, v), v)
    by_common = sorted(common, key=lambda p: (-common[p], -best[p]))
    by_score = sorted(best, key=lambda p: -best[p])
    weight = {p: len(by_score) - i for i, p in enumerate(by_score)}
    res: list[int] = []
    for k in sorted({k for k, _, _ in requests}):
        lam = k - len(res)
        if lam <= 0:
            continue
        group = [(g, s) for kk, g, s in requests if kk == k]
        if len(group) == 1:
            g, s = group[0]
            mine = [p for _, p in sorted(zip(s, g), key=lambda t: -t[0]) if p not in res]
            res += mine[:lam]
        else:
            least: dict[int, int] = {}
            for g, s in group:
                for p, v in zip(g, s):
                    least[p] = min(least.get(p, v), v)
            own = sorted(least, key=lambda p: -least[p])
            wanted = [(set(g), g) for kk, g, _ in requests if kk >= k]
            res += _best_mix(res, lam, own, by_common, by_score, wanted, weight, grid)
        fill = [p for p in by_score + by_common if p not in res]   # G_i may be short of lambda columns
        res += fill[:max(0, k - len(res))]
    return res


def _pick(base: list[int], lam: int, a: float, b: float, own, by_common, by_score) -> list[int]:
    chosen = list(base)
    for source, count in ((own, int(np.floor(a * lam))), (by_common, int(np.floor(b * lam)))):
        chosen += [p for p in source if p not in chosen][:count]
    chosen += [p for p in by_score if p not in chosen][:lam - (len(chosen) - len(base))]
    return chosen[len(base):]


def _best_mix(res, lam, own, by_common, by_score, wanted, weight, grid) -> list[int]:
    """Algorithm 2's search for (a, b, c = 1 - a - b): maximize min-Coverage - max-Risk."""
    best, best_score = None, -np.inf
    steps = int(round(1 / grid))
    for i in range(steps + 1):
        for j in range(steps + 1 - i):
            new = _pick(res, lam, i * grid, j * grid, own, by_common, by_score)
            sel = set(res) | set(new)
            cover = min(len(gs & sel) / len(gs) for gs, _ in wanted if gs)
            risk = max(sum(weight[p] for p in g if p not in sel) / sum(weight[p] for p in g) for _, g in wanted if g)
            if cover - risk > best_score + 1e-12:
                best, best_score = new, cover - risk
    return best
