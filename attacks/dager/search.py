"""DAGER's sentence searches at layer 2 (layer 1: attacks/dager/layer1.py).

Decoders (causal): greedy prefix extension, attacks/dager/decoder.py.

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

from attacks.dager.arch import Arch
from attacks.dager.span import Span

Sentence = tuple[list[int], float]   # token ids, mean layer-2 distance


def _scores(arch: Arch, span: Span, seqs: torch.Tensor, batch: int = 512) -> torch.Tensor:
    """Layer-2 distance at every position, (N, L)."""
    return torch.cat([span.distance(arch.layer_inputs(seqs[i:i + batch])) for i in range(0, len(seqs), batch)])


def _similar(a: list[int], b: list[int], frac: float) -> bool:
    n = max(len(a), len(b))
    return sum(x == y for x, y in zip(a, b)) >= frac * n


def best_distinct_ids(rows, scores: list[float], k: int, frac: float) -> list[int]:
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
    return [(seqs[i], scores[i]) for i in best_distinct_ids(seqs, scores, k, frac)]


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
