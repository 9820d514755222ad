"""DAGER's two searches: per-position token filtering at layer 1, then whole sentences at layer 2.

Decoders (causal): greedy prefix extension. Every surviving prefix is extended by every
layer-1 candidate of the next position; an extension survives when the layer-2 input at
every position is within `l2` of the span. A prefix with no surviving extension is a
finished sentence. As in the official code, the best failing extensions (B of them, no
two sharing >= 70% of their tokens) are carried along flagged as approximate, so a
broken sentence still yields its best guess; they are only kept while the finished exact
sentences and the exact prefixes alive number fewer than B (each alive one ends in a
distinct exact sentence, and assemble() fills from fall-backs only below B). First tokens
that fail layer 2 are fall-backs too (the B closest), not prefixes. With position-free layer-1 inputs (LLaMA) the
same candidates hold at every position up to the maximum length, so the search stops once
no exact prefix is left instead of growing the fall-backs to that length; and a prefix of one
repeated token is not extended by that token: values carry no position there, so attention
over copies of one token returns its value whatever the rotary weights, and "t t t" passes
wherever "t" does (the official code refuses the same degeneracy after a BOS).

Encoders (bidirectional): each [SEP] that passes layer 1 at position l fixes a sentence
of length l + 1; the per-position candidate sets (cut to the top B, DAGER's `maxB`
heuristic) are enumerated exhaustively when their product is at most `max_combinations`,
and scored by the mean layer-2 distance. Above that budget the official code samples
combinations at random; we run a coordinate search instead (from B starts, each position
set to its best candidate with the others fixed, until nothing changes), which is
cheaper on a CPU and never worse than its starts.
"""
from __future__ import annotations

import itertools
import math

import torch

from attacks.dager_arch import Arch
from attacks.dager_span import Span

Sentence = tuple[list[int], float]   # token ids, mean layer-2 distance


def layer1_tokens(arch: Arch, span: Span, thresh: float, max_len: int, drop: set[int],
                  chunk: int = 8192) -> tuple[list[list[int]], list[int]]:
    """Per position, the vocabulary tokens within `thresh` of the layer-1 span (closest first), until a
    position has none; and the positions where the end token (drop-listed specials such as [SEP]) passed.
    Position-free layer-1 inputs (rotary models) take one pass, whose set holds at every position."""
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


def layer1_distances(arch: Arch, span: Span, position: int, chunk: int = 8192) -> torch.Tensor:
    """Distance of every vocabulary token's layer-1 input at `position` to the span, (vocab,)."""
    vocab = arch.vocab_size()
    return torch.cat([span.distance(arch.layer1_candidates(position, slice(s, min(s + chunk, vocab))))
                      for s in range(0, vocab, chunk)])


def _scores(arch: Arch, span: Span, seqs: torch.Tensor, batch: int = 512) -> torch.Tensor:
    """Layer-2 distance at every position, (N, L)."""
    return torch.cat([span.distance(arch.layer_inputs(seqs[i:i + batch])) for i in range(0, len(seqs), batch)])


def _similar(a: list[int], b: list[int], frac: float) -> bool:
    n = max(len(a), len(b))
    return sum(x == y for x, y in zip(a, b)) >= frac * n


def _best_distinct_ids(rows, scores: list[float], k: int, frac: float) -> list[int]:
    """Indices of the k best-scoring rows (lowest first) of which no two share >= frac of their tokens;
    rows is indexable by position, returning token lists, and is only read for the rows examined."""
    out: list[int] = []
    kept: list[list[int]] = []
    for i in sorted(range(len(scores)), key=lambda j: scores[j]):
        if len(out) == k:
            break
        row = rows[i]
        if not any(_similar(row, s, frac) for s in kept):
            out.append(i)
            kept.append(row)
    return out


def _best_distinct(seqs: list[list[int]], scores: list[float], k: int, frac: float) -> list[Sentence]:
    return [(seqs[i], scores[i]) for i in _best_distinct_ids(seqs, scores, k, frac)]


def decoder_search(arch: Arch, span: Span, tokens: list[list[int]], batch_size: int, l2: float,
                   distinct: float = 0.7, max_prefixes: int = 20000) -> tuple[list[Sentence], list[Sentence]]:
    """(finished sentences that passed every check, approximate fall-backs).

    A prefix is `good` while every position so far passed (fall-backs are not); `total` is the sum of
    its layer-2 distances, so a sentence's score is their mean. Only the new position is computed per
    extension (Arch.next_layer2_inputs); the earlier ones are the prefix's, unchanged under causality."""
    if not tokens or not tokens[0]:
        return [], []
    dev = arch.device
    first = torch.tensor(tokens[0], device=dev)
    emb, q, k, v = arch.token_kv(first, 0)
    empty = k.new_zeros((1, 0) + k.shape[1:])
    dist = span.distance(arch.next_layer2_inputs(empty, empty, (emb, q, k, v)))[0]
    keep = torch.nonzero(dist < l2).flatten()
    if len(keep) < batch_size:        # fall-backs: the closest failing first tokens, as at every later step
        failing = torch.nonzero(dist >= l2).flatten()
        keep = torch.cat([keep, failing[torch.argsort(dist[failing])[:batch_size]]])
    prefixes, keys, values = first[keep].unsqueeze(1), k[keep].unsqueeze(1), v[keep].unsqueeze(1)
    total = dist[keep]
    passed = total < l2               # every position so far within l2
    good = passed.clone()             # not a fall-back
    exact: list[Sentence] = []
    approx: list[Sentence] = []
    sure = 0                          # finished sentences whose every position passed
    for p in range(1, len(tokens)):
        if not tokens[p]:
            break
        cand = torch.tensor(tokens[p], device=dev)
        n, kc = len(prefixes), len(cand)
        step = arch.token_kv(cand, p)
        _, _, cand_keys, cand_values = step
        dist = span.distance(arch.next_layer2_inputs(keys, values, step)).flatten()   # (n * kc,)
        parent = torch.arange(n, device=dev).repeat_interleave(kc)
        child = torch.arange(kc, device=dev).repeat(n)
        ok = (dist < l2) & (passed & good)[parent]
        if arch.position_free:   # "t t ... t" has t's own layer-2 input at every position: no evidence
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
            bad = bad[:0]   # B exact sentences are certain: assemble() would never read a fall-back
        fall = bad[_best_distinct_ids(_LazyRows(ext, bad), mean[bad].tolist(), batch_size, distinct)]
        approx += [(s, float(sc)) for s, sc in zip(ext(fall).tolist(), mean[fall].tolist())]
        take = torch.cat([torch.nonzero(ok).flatten()[:max_prefixes], fall])
        prefixes = ext(take)
        keys = torch.cat([keys[parent[take]], cand_keys[child[take]].unsqueeze(1)], 1)
        values = torch.cat([values[parent[take]], cand_values[child[take]].unsqueeze(1)], 1)
        total, passed = sums[take], torch.ones(len(take), dtype=torch.bool, device=dev)
        good = torch.arange(len(take), device=dev) < len(take) - len(fall)
        if len(prefixes) == 0 or (arch.position_free and not bool(good.any())):
            break   # position-free candidates never run out: stop once only fall-backs are left
    for i in range(len(prefixes)):
        (exact if good[i] else approx).append((prefixes[i].tolist(), float(total[i]) / prefixes.shape[1]))
    return exact, approx


class _LazyRows:
    """Rows of the extensions `bad` (built one at a time), for _best_distinct_ids."""

    def __init__(self, ext, ids: torch.Tensor):
        self.ext, self.ids = ext, ids

    def __getitem__(self, i: int) -> list[int]:
        return self.ext(self.ids[i:i + 1])[0].tolist()


def encoder_search(arch: Arch, span: Span, tokens: list[list[int]], ends: list[int], start: int, end: int,
                   batch_size: int, max_combinations: int, distinct: float = 0.7) -> list[Sentence]:
    """Best `batch_size` distinct sentences for every sentence length the layer-1 [SEP] hits imply."""
    found: list[Sentence] = []
    for last in ends:
        sets = [tokens[p][:batch_size] for p in range(1, last)]
        if any(not s for s in sets):
            continue
        if math.prod(len(s) for s in sets) <= max_combinations:
            combos = [list(c) for c in itertools.product(*sets)]
            seqs, scores = _score_words(arch, span, combos, start, end)
        else:
            seqs, scores = _coordinate_search(arch, span, sets, start, end, batch_size)
        found += _best_distinct(seqs, scores, batch_size, distinct)
    return found


def _score_words(arch: Arch, span: Span, words: list[list[int]], start: int, end: int):
    seqs = torch.tensor([[start] + w + [end] for w in words])
    return [s.tolist() for s in seqs], _scores(arch, span, seqs).mean(1).tolist()


def _coordinate_search(arch, span, sets, start, end, starts: int, sweeps: int = 3):
    seen: dict[tuple, float] = {}
    for s in range(starts):
        current = [c[min(s, len(c) - 1)] for c in sets]
        for _ in range(sweeps):
            changed = False
            for pos, options in enumerate(sets):
                trials = [current[:pos] + [o] + current[pos + 1:] for o in options]
                seqs, scores = _score_words(arch, span, trials, start, end)
                seen.update({tuple(q): sc for q, sc in zip(seqs, scores)})
                best = options[min(range(len(options)), key=lambda i: scores[i])]
                changed |= best != current[pos]
                current[pos] = best
            if not changed:
                break
    return [list(q) for q in seen], list(seen.values())


def assemble(exact: list[Sentence], approx: list[Sentence], batch_size: int, l2: float,
             distinct: float = 0.7) -> tuple[list[list[int]], int]:
    """B sentences, exact ones (score < l2) first, then the best approximate ones not resembling any chosen;
    returns (sentences, number exact)."""
    pool = exact + approx
    sure = [s for s, sc in pool if sc < l2]
    rest = [(s, sc) for s, sc in pool if sc >= l2]
    chosen = []
    for s in sure:
        if s not in chosen:
            chosen.append(s)
    n_exact = min(len(chosen), batch_size)
    chosen = chosen[:batch_size]
    for s, _ in sorted(rest, key=lambda x: x[1]):
        if len(chosen) >= batch_size:
            break
        if not any(_similar(s, c, distinct) for c in chosen):
            chosen.append(s)
    return chosen, n_exact
