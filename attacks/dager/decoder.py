"""DAGER's decoder search: greedy prefix extension at layer 2, testing fewer extensions for the same sentences.

The search (as in the official code): every surviving prefix is extended by every layer-1
candidate of the next position; an extension survives when its new position's layer-2 input is
within `l2` of the span (causality leaves the earlier positions unchanged). A prefix with no
surviving extension is a finished sentence. While fewer than B exact sentences are certain
(finished plus alive prefixes, each ending in a distinct one), the B best failing extensions, no
two sharing >= 70 % of their tokens, are carried along as approximate fall-backs; first tokens
that fail layer 2 are fall-backs too (the B closest). With position-free layer-1 inputs (LLaMA)
the same candidates hold at every position, so the search stops once no exact prefix is left;
and a prefix of one repeated token is not extended by that token: values carry no position
there, so "t t t" passes wherever "t" does (the official code refuses the same after a BOS).

Layer-2 saturation: when more than `max_prefixes` (20,000) extensions pass at one step, the layer-2
test no longer tells sentences apart (a batch whose gradient span covers most of the input space lets
nearly every extension through), so the search stops there and returns the prefixes it holds; the step
is reported as `saturated_at` and DAGER flags the batch saturated, as it does at the rank cap. The
official code has no such bound and would go on extending every passing prefix (on 2 cores, hours a
batch at 64 tokens); the plain reference search in tests/ keeps the first 20,000 instead.

Two things make it cheaper without changing a sentence:
- The exact sentences depend only on prefixes whose every position passed, never on the
  fall-backs, and assemble() reads fall-backs only when fewer than B distinct exact sentences
  come out. The search runs without fall-backs first and reruns with them only then.
- Each step's (prefix, candidate) pairs first go through block 0 with its matrix products in
  bfloat16 (Arch.coarse_layer2_inputs, a block of pairs at a time); only pairs within l2 + MARGIN of the span there get the
  float32 pass that decides. Fall-backs are ranked by float32 means computed in order of their
  lower bound (bfloat16 distance - MARGIN) until the B best distinct ones are settled.

MARGIN: bfloat16 keeps 8 significant bits (unit roundoff u = 2^-8 = 0.0039); a distance is
|C^T x| / |x| for the unit complement basis C, so it moves by at most 2 |dx| / |x|, and the
layer-2 input's relative error is a few u. Measured on d = 768 GPT-2 and SmolLM2 batches (about
2 million pairs): |bfloat16 - float32 distance| <= 0.011 (GPT-2) and 0.012 (SmolLM2), median 0.001;
MARGIN = 0.02 sits above the largest, and every step checks it: when a pair that got the float32
pass moved more than MARGIN / 2 from its bfloat16 distance, the whole step is redone in float32
(counted as "untrusted"). True extensions sit at 1e-7 in float32, wrong ones at 0.2-1.4 (at the
rank cap, fewer than 1 % below 0.1), so the pre-test passes the true ones and few others.
"""
from __future__ import annotations

import torch

from attacks.dager.arch import Arch
from attacks.dager.search import Sentence
from attacks.dager.span import Span

MARGIN = 0.02


def decoder_search(arch: Arch, span: Span, tokens: list[list[int]], batch_size: int, l2: float,
                   distinct: float = 0.7, max_prefixes: int = 20000,
                   counts: dict | None = None) -> tuple[list[Sentence], list[Sentence], int | None]:
    """(finished sentences that passed every check, approximate fall-backs, the position where more than
    `max_prefixes` extensions passed and the search stopped, or None); `counts` (if given) collects how many
    extensions each pass tested per position."""
    if not tokens or not tokens[0]:
        return [], [], None
    search = _Search(arch, span, tokens, batch_size, l2, distinct, max_prefixes, counts)
    exact, approx = search.run(fallbacks=False)
    if len({tuple(s) for s, _ in exact}) < batch_size:
        exact, approx = search.run(fallbacks=True)
    return exact, approx, search.saturated_at


class _Search:
    def __init__(self, arch: Arch, span: Span, tokens, batch_size: int, l2: float, distinct: float,
                 max_prefixes: int, counts: dict | None):
        self.arch, self.span, self.tokens, self.b = arch, span, tokens, batch_size
        self.l2, self.distinct, self.max_prefixes = l2, distinct, max_prefixes
        self.counts = counts if counts is not None else {}
        self.saturated_at: int | None = None   # the step where more than max_prefixes extensions passed

    def _count(self, key: str, p: int, n: int) -> None:
        per = self.counts.setdefault(key, [])
        per.extend([0] * (p + 1 - len(per)))
        per[p] += n

    def run(self, fallbacks: bool) -> tuple[list[Sentence], list[Sentence]]:
        """A prefix is `good` while every position so far passed (fall-backs are not); `total` is the sum of
        its layer-2 distances, so a sentence's score is their mean."""
        arch, l2, b = self.arch, self.l2, self.b
        dev = arch.device
        first = torch.tensor(self.tokens[0], device=dev)
        emb, q, k, v = arch.token_kv(first, 0)
        empty = k.new_zeros((1, 0) + k.shape[1:])
        dist = self.span.distance(arch.next_layer2_inputs(empty, empty, (emb, q, k, v)))[0]
        keep = torch.nonzero(dist < l2).flatten()
        if fallbacks and len(keep) < b:   # the closest failing first tokens, as at every later step
            failing = torch.nonzero(dist >= l2).flatten()
            keep = torch.cat([keep, failing[torch.argsort(dist[failing])[:b]]])
        prefixes, keys, values = first[keep].unsqueeze(1), k[keep].unsqueeze(1), v[keep].unsqueeze(1)
        total = dist[keep]
        good = total < l2
        exact: list[Sentence] = []
        approx: list[Sentence] = []
        sure = 0                          # finished sentences whose every position passed
        for p in range(1, len(self.tokens)):
            if not self.tokens[p] or len(prefixes) == 0:   # no first token passed and no fall-backs are kept
                break
            cand = torch.tensor(self.tokens[p], device=dev)
            n, kc = len(prefixes), len(cand)
            step = arch.token_kv(cand, p)
            parent = torch.arange(n, device=dev).repeat_interleave(kc)
            child = torch.arange(kc, device=dev).repeat(n)
            coarse = arch.layer2_distances(keys, values, step, self.span.distance, coarse=True).flatten()
            self._count("coarse" if not fallbacks else "coarse_fallbacks", p, n * kc)
            dist = torch.full_like(coarse, float("inf"))     # float32 distance where computed
            check = torch.nonzero(good[parent] & (coarse < l2 + MARGIN)).flatten()
            self._exact(dist, check, keys, values, step, parent, child, p)
            if len(check) and float((coarse[check] - dist[check]).abs().max()) > MARGIN / 2:
                dist = arch.layer2_distances(keys, values, step, self.span.distance).flatten()   # untrusted:
                coarse = dist                                                                      # all float32
                self._count("untrusted", p, n * kc)
            ok = (dist < l2) & good[parent]
            if arch.position_free:   # "t t ... t" has t's own layer-2 input at every position: no evidence
                ok &= ~(((prefixes == prefixes[:, :1]).all(1)[parent]) & (cand[child] == prefixes[parent, 0]))
            if int(ok.sum()) > self.max_prefixes:   # the test no longer separates sentences: stop here
                self.saturated_at = p if self.saturated_at is None else min(p, self.saturated_at)
                break
            dead = ~ok.view(n, kc).any(1)
            for i in torch.nonzero(dead & good).flatten().tolist():
                exact.append((prefixes[i].tolist(), float(total[i]) / p))
            sure += int((dead & good).sum())
            ext = lambda ids: torch.cat([prefixes[parent[ids]], cand[child[ids]].unsqueeze(1)], 1)   # noqa: E731
            passing = torch.nonzero(ok).flatten()
            fall = passing[:0]
            if fallbacks and sure + len(passing) < b:
                fall = self._fallbacks(torch.nonzero(~ok).flatten(), coarse, dist, total, keys, values, step, parent,
                                       child, prefixes, cand, p)
                mean = (total[parent[fall]] + dist[fall]) / (p + 1)
                approx += [(s, float(sc)) for s, sc in zip(ext(fall).tolist(), mean.tolist())]
            take = torch.cat([passing, fall])
            prefixes = ext(take)
            keys = torch.cat([keys[parent[take]], step[2][child[take]].unsqueeze(1)], 1)
            values = torch.cat([values[parent[take]], step[3][child[take]].unsqueeze(1)], 1)
            total = total[parent[take]] + dist[take]
            good = torch.arange(len(take), device=dev) < len(passing)
            if len(prefixes) == 0 or (arch.position_free and not bool(good.any())):
                break   # position-free candidates never run out: stop once only fall-backs are left
        for i in range(len(prefixes)):
            (exact if good[i] else approx).append((prefixes[i].tolist(), float(total[i]) / prefixes.shape[1]))
        return exact, approx

    def _exact(self, dist, ids, keys, values, step, parent, child, p: int, what: str = "exact") -> None:
        """Float32 distances of the extensions ids (flat indices), written into dist."""
        if len(ids):
            x = self.arch.pair_layer2_inputs(keys, values, step, parent[ids], child[ids])
            dist[ids] = self.span.distance(x)
            self._count(what, p, len(ids))

    def _fallbacks(self, bad, coarse, dist, total, keys, values, step, parent, child, prefixes, cand,
                   p: int) -> torch.Tensor:
        """The B best failing extensions by mean distance of which no two share >= `distinct` of their tokens
        (flat indices, best first): what best_distinct_ids picks from all of them ranked in float32. The ranking
        is walked lazily: a mean is computed in float32 only once its lower bound (from the bfloat16 distance) is
        the smallest left, and an extension sharing too much with one already picked (which ranks before it) is
        passed over without computing it."""
        base = total[parent[bad]]
        known = torch.isfinite(dist[bad])
        key = (base + torch.where(known, dist[bad], (coarse[bad] - MARGIN).clamp_min(0))) / (p + 1)
        open_ = torch.ones(len(bad), dtype=torch.bool, device=bad.device)
        shared = (prefixes[:, None] == prefixes[None]).sum(-1)      # tokens two prefixes share, (n, n)
        owner, token = parent[bad], cand[child[bad]]
        picks: list[int] = []
        while len(picks) < self.b:
            i = int(torch.argmin(torch.where(open_, key, float("inf"))))   # ties: the lower index, as a stable sort
            if not bool(open_[i]):
                break
            if not bool(known[i]):
                rows = torch.nonzero(open_ & ~known).flatten()
                rows = rows[torch.topk(key[rows], min(2 * self.b, len(rows)), largest=False).indices]
                self._exact(dist, bad[rows], keys, values, step, parent, child, p, "exact_ranking")
                key[rows] = (base[rows] + dist[bad[rows]]) / (p + 1)
                known[rows] = True
                continue
            picks.append(i)
            open_ &= (shared[owner, owner[i]] + (token == token[i])) < self.distinct * (p + 1)
        return bad[torch.tensor(picks, dtype=torch.long, device=bad.device)]
