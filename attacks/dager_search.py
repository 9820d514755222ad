"""DAGER's two searches: per-position token filtering at layer 1, then whole sentences at layer 2.

Decoders (causal): greedy prefix extension. Every surviving prefix is extended by every
layer-1 candidate of the next position; an extension survives when the layer-2 input at
every position is within `l2` of the span. A prefix with no surviving extension is a
finished sentence. As in the official code, the best failing extensions (B of them, no
two sharing >= 70% of their tokens) are carried along flagged as approximate, so a
broken sentence still yields its best guess.

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
    position has none; and the positions where the end token (drop-listed specials such as [SEP]) passed."""
    vocab = arch.vocab_size()
    tokens, special_hits = [], []
    for p in range(max_len):
        dist = torch.cat([span.distance(arch.layer1_candidates(p, slice(s, min(s + chunk, vocab))))
                          for s in range(0, vocab, chunk)])
        hit = torch.nonzero(dist < thresh).flatten()
        hit = hit[torch.argsort(dist[hit])].tolist()
        if not hit:
            break
        special_hits.append([t for t in hit if t in drop])
        tokens.append([t for t in hit if t not in drop])
    return tokens, special_hits


def _scores(arch: Arch, span: Span, seqs: torch.Tensor, batch: int = 512) -> torch.Tensor:
    """Layer-2 distance at every position, (N, L)."""
    return torch.cat([span.distance(arch.layer_inputs(seqs[i:i + batch])) for i in range(0, len(seqs), batch)])


def _similar(a: list[int], b: list[int], frac: float) -> bool:
    n = max(len(a), len(b))
    return sum(x == y for x, y in zip(a, b)) >= frac * n


def _best_distinct(seqs: list[list[int]], scores: list[float], k: int, frac: float) -> list[Sentence]:
    out: list[Sentence] = []
    for i in sorted(range(len(seqs)), key=lambda j: scores[j]):
        if len(out) == k:
            break
        if not any(_similar(seqs[i], s, frac) for s, _ in out):
            out.append((seqs[i], scores[i]))
    return out


def decoder_search(arch: Arch, span: Span, tokens: list[list[int]], batch_size: int, l2: float,
                   distinct: float = 0.7, max_prefixes: int = 20000) -> tuple[list[Sentence], list[Sentence]]:
    """(finished sentences that passed every check, approximate fall-backs)."""
    if not tokens or not tokens[0]:
        return [], []
    prefixes = torch.tensor(tokens[0]).unsqueeze(1)
    good = torch.ones(len(prefixes), dtype=torch.bool)         # False: carried as approximate
    scores = _scores(arch, span, prefixes).mean(1)
    exact: list[Sentence] = []
    approx: list[Sentence] = []
    for p in range(1, len(tokens)):
        cand = torch.tensor(tokens[p])
        if len(cand) == 0:
            break
        n, k = len(prefixes), len(cand)
        ext = torch.cat([prefixes.repeat_interleave(k, 0), cand.repeat(n).unsqueeze(1)], 1)
        dist = _scores(arch, span, ext)
        ok = (dist < l2).all(1) & good.repeat_interleave(k)
        mean = dist.mean(1)
        dead = ~ok.view(n, k).any(1)
        for i in torch.nonzero(dead & good).flatten().tolist():
            exact.append((prefixes[i].tolist(), float(scores[i])))
        bad_ids = torch.nonzero(~ok).flatten()
        fall = _best_distinct([ext[i].tolist() for i in bad_ids.tolist()], mean[bad_ids].tolist(), batch_size,
                              distinct)
        approx += fall
        keep = torch.nonzero(ok).flatten()[:max_prefixes]
        prefixes = torch.cat([ext[keep]] + ([torch.tensor([s for s, _ in fall])] if fall else []))
        scores = torch.cat([mean[keep], torch.tensor([sc for _, sc in fall])])
        good = torch.cat([torch.ones(len(keep), dtype=torch.bool), torch.zeros(len(fall), dtype=torch.bool)])
        if len(prefixes) == 0:
            break
    for i in range(len(prefixes)):
        (exact if good[i] else approx).append((prefixes[i].tolist(), float(scores[i])))
    return exact, approx


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
