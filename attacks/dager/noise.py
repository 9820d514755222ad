"""DAGER under Gaussian gradient noise (decoders): outliers instead of thresholds.

With noise the gradient has full rank, so no candidate is exactly in the span; the true
ones are merely closer. As in the official code, distances d are mapped to
log d - log(1 - d) and z-scored over all candidates of a step; true candidates are the
outliers far below the mean. Position 0 keeps the tokens under -`std` sigma; later
positions keep the closest max(50 B, 5 % of the vocabulary) tokens, but, unlike the
official code (which runs to the maximum length), only while some token is still a
-`std` sigma outlier, and only the outliers among them, which keeps the CPU search
bounded. At layer 2 each step keeps at most B extensions whose mean distance is such an
outlier; a prefix without one is a finished (approximate) sentence.
"""
from __future__ import annotations

import torch

from attacks.dager.arch import Arch
from attacks.dager.layer1 import layer1_distances
from attacks.dager.search import Sentence, _scores
from attacks.dager.span import Span


def _z(dist: torch.Tensor) -> torch.Tensor:
    d = dist.double().clamp(1e-12, 1 - 1e-12)
    logit = d.log() - (1 - d).log()
    return (logit - logit.mean()) / logit.std().clamp_min(1e-12)


def noisy_layer1_tokens(arch: Arch, span: Span, max_len: int, drop: set[int], batch_size: int, std: float,
                        chunk: int = 8192) -> list[list[int]]:
    cap = max(50 * batch_size, int(0.05 * arch.vocab_size()))
    tokens = []
    for p in range(max_len):
        dist = layer1_distances(arch, span, p, chunk)
        z = _z(dist)
        order = torch.argsort(dist)[:cap]
        hit = [t for t in order.tolist() if z[t] < -std and t not in drop]
        if not hit:
            break
        tokens.append(hit)
        if arch.position_free:   # rotary models: one pass holds at every position (official: position 0's set)
            return tokens * max_len
    return tokens


def noisy_decoder_search(arch: Arch, span: Span, tokens: list[list[int]], batch_size: int,
                         std: float) -> tuple[list[Sentence], list[Sentence]]:
    """([], approximate sentences): nothing is exact under noise."""
    if not tokens:
        return [], []
    prefixes = torch.tensor(tokens[0][:batch_size]).unsqueeze(1)
    scores = _scores(arch, span, prefixes).mean(1)
    done: list[Sentence] = []
    for p in range(1, len(tokens)):
        cand = torch.tensor(tokens[p])
        n, k = len(prefixes), len(cand)
        ext = torch.cat([prefixes.repeat_interleave(k, 0), cand.repeat(n).unsqueeze(1)], 1)
        mean = _scores(arch, span, ext).mean(1)
        z = _z(mean) if len(mean) > 1 else torch.full_like(mean, -float("inf"), dtype=torch.double)
        order = [i for i in torch.argsort(mean).tolist() if z[i] < -std][:batch_size]
        alive = {i // k for i in order}
        done += [(prefixes[i].tolist(), float(scores[i])) for i in range(n) if i not in alive]
        if not order:
            prefixes = prefixes[:0]
            break
        prefixes, scores = ext[order], mean[order]
    done += [(prefixes[i].tolist(), float(scores[i])) for i in range(len(prefixes))]
    return [], done
