"""DAGER's decoder search and layer-1 filter as they were before the pre-tests (commit 6324612): every
(prefix, candidate) pair through block 0 in float32, fall-backs carried from the start, every vocabulary token
at every position. What the faster search must reproduce sentence for sentence, and the speed benchmark's
baseline on the same batch."""
from __future__ import annotations

import contextlib

import torch

from attacks.dager.layer1 import layer1_distances
from attacks.dager.search import Sentence, best_distinct_ids


def reference_layer1_tokens(arch, span, thresh: float, max_len: int, drop: set[int], chunk: int = 8192):
    tokens, special_hits = [], []
    for p in range(max_len):
        dist = layer1_distances(arch, span, p, chunk)
        hit = torch.nonzero(dist < thresh).flatten()
        hit = hit[torch.argsort(dist[hit])].tolist()
        if not hit:
            break
        special_hits.append([t for t in hit if t in drop])
        tokens.append([t for t in hit if t not in drop])
        if arch.position_free:
            return tokens * max_len, special_hits * max_len
    return tokens, special_hits


def reference_decoder_search(arch, span, tokens: list[list[int]], batch_size: int, l2: float,
                             distinct: float = 0.7, max_prefixes: int = 20000, counts: dict | None = None
                             ) -> tuple[list[Sentence], list[Sentence]]:
    """`counts` (if given) collects the extensions tested per position under "reference"."""
    if not tokens or not tokens[0]:
        return [], []
    per = counts.setdefault("reference", []) if counts is not None else []
    dev = arch.device
    first = torch.tensor(tokens[0], device=dev)
    emb, q, k, v = arch.token_kv(first, 0)
    empty = k.new_zeros((1, 0) + k.shape[1:])
    dist = span.distance(arch.next_layer2_inputs(empty, empty, (emb, q, k, v)))[0]
    keep = torch.nonzero(dist < l2).flatten()
    if len(keep) < batch_size:
        failing = torch.nonzero(dist >= l2).flatten()
        keep = torch.cat([keep, failing[torch.argsort(dist[failing])[:batch_size]]])
    prefixes, keys, values = first[keep].unsqueeze(1), k[keep].unsqueeze(1), v[keep].unsqueeze(1)
    total = dist[keep]
    passed = total < l2
    good = passed.clone()
    exact: list[Sentence] = []
    approx: list[Sentence] = []
    sure = 0
    for p in range(1, len(tokens)):
        if not tokens[p]:
            break
        cand = torch.tensor(tokens[p], device=dev)
        n, kc = len(prefixes), len(cand)
        per.append(n * kc)
        step = arch.token_kv(cand, p)
        _, _, cand_keys, cand_values = step
        dist = span.distance(arch.next_layer2_inputs(keys, values, step)).flatten()
        parent = torch.arange(n, device=dev).repeat_interleave(kc)
        child = torch.arange(kc, device=dev).repeat(n)
        ok = (dist < l2) & (passed & good)[parent]
        if arch.position_free:
            ok &= ~(((prefixes == prefixes[:, :1]).all(1)[parent]) & (cand[child] == prefixes[parent, 0]))
        sums = total[parent] + dist
        mean = sums / (p + 1)
        dead = ~ok.view(n, kc).any(1)
        for i in torch.nonzero(dead & good).flatten().tolist():
            exact.append((prefixes[i].tolist(), float(total[i]) / p))
        sure += int((dead & good & passed).sum())
        bad = torch.nonzero(~ok).flatten()
        ext = lambda ids: torch.cat([prefixes[parent[ids]], cand[child[ids]].unsqueeze(1)], 1)   # noqa: E731
        if sure + min(int(ok.sum()), max_prefixes) >= batch_size:
            bad = bad[:0]
        fall = bad[best_distinct_ids(_LazyRows(ext, bad), mean[bad].tolist(), batch_size, distinct)]
        approx += [(s, float(sc)) for s, sc in zip(ext(fall).tolist(), mean[fall].tolist())]
        take = torch.cat([torch.nonzero(ok).flatten()[:max_prefixes], fall])
        prefixes = ext(take)
        keys = torch.cat([keys[parent[take]], cand_keys[child[take]].unsqueeze(1)], 1)
        values = torch.cat([values[parent[take]], cand_values[child[take]].unsqueeze(1)], 1)
        total, passed = sums[take], torch.ones(len(take), dtype=torch.bool, device=dev)
        good = torch.arange(len(take), device=dev) < len(take) - len(fall)
        if len(prefixes) == 0 or (arch.position_free and not bool(good.any())):
            break
    for i in range(len(prefixes)):
        (exact if good[i] else approx).append((prefixes[i].tolist(), float(total[i]) / prefixes.shape[1]))
    return exact, approx


class _LazyRows:
    def __init__(self, ext, ids: torch.Tensor):
        self.ext, self.ids = ext, ids

    def __getitem__(self, i: int) -> list[int]:
        return self.ext(self.ids[i:i + 1])[0].tolist()


@contextlib.contextmanager
def reference_dager(counts: dict | None = None):
    """Within the block, the dager attack runs the reference search and layer-1 filter."""
    import attacks.dager.attack as dager
    saved = dager.decoder_search, dager.layer1_tokens
    dager.decoder_search = lambda *a, **k: (*reference_decoder_search(*a, counts=counts, **k), None)
    dager.layer1_tokens = reference_layer1_tokens
    try:
        yield
    finally:
        dager.decoder_search, dager.layer1_tokens = saved


@contextlib.contextmanager
def counting_dager(counts: dict):
    """Within the block, the dager attack's own search records its extensions per position into `counts`."""
    import attacks.dager.attack as dager
    saved = dager.decoder_search
    dager.decoder_search = lambda *a, **k: saved(*a, counts=counts, **k)
    try:
        yield
    finally:
        dager.decoder_search = saved
