"""DAGER's layer-1 filter: per position, the vocabulary tokens whose layer-1 input lies within `l1` of the span.

GPT-2 and BERT feed layer 1 LayerNorm(token[t] + position[p]) (layouts' `layer1_parts`). Testing
every (token, position) pair directly costs a vocabulary-wide LayerNorm and projection per
position; the pre-test here needs one vocabulary-wide product for all positions. With c the
centered rows, g = gamma * c, M the span's map (LoRA transform, kept coordinates) and r the
residual off the span, the input is v = (g_t + g_p) / s + beta with
s^2 = |c_t + c_p|^2 / d + eps, so

  |M v|^2 s^2   = |a|^2 + 2 a.b + |b|^2 + 2 s e.(a + b) + s^2 |e|^2
  |r M v|^2 s^2 = |r a|^2 + 2 a.r b + |r b|^2 + 2 s r e.(a + b) + s^2 |r e|^2

(a = M g_t, b = M g_p, e = M beta; r is an orthogonal projection, so r a . r b = a . r b). Every
token-position term is c_t . w for a vector w per position (M's adjoint carries M to the token
side): one product of the centered vocabulary with 3 L + 2 columns. In float32 each term is off
by at most about d u |x||y| (u = 2^-24; 5e-5 relative at d = 768), so the squared distance by
well under 1e-3: tokens farther than l1 + MARGIN (0.05; 0.0025 on the square) are dropped, and
the rest get the plain float32 distance that decides and orders them, as before. Measured on
d = 768 GPT-2 batches, true tokens pre-test at <= 3e-3 and other tokens at >= 0.2.
"""
from __future__ import annotations

import torch

from attacks.dager.arch import Arch
from attacks.dager.span import Span

MARGIN = 0.05


def layer1_tokens(arch: Arch, span: Span, thresh: float, max_len: int, drop: set[int],
                  chunk: int = 8192) -> tuple[list[list[int]], list[int]]:
    """Per position, the vocabulary tokens within `thresh` of the layer-1 span (closest first), until a
    position has none; and the positions where the end token (drop-listed specials such as [SEP]) passed.
    Position-free layer-1 inputs (rotary models) take one pass, whose set holds at every position."""
    parts = None if arch.position_free else arch.layout.layer1_parts()
    maybe = pretest(parts, span, max_len, thresh + MARGIN, chunk) if parts is not None else None
    tokens, special_hits = [], []
    for p in range(max_len):
        if maybe is None:
            ids, dist = None, layer1_distances(arch, span, p, chunk)
        else:
            ids = maybe[p]
            dist = span.distance(arch.layer1_candidates(p, ids)) if len(ids) else torch.zeros(0)
        hit = torch.nonzero(dist < thresh).flatten()
        hit = hit[torch.argsort(dist[hit])]
        hit = (hit if ids is None else ids[hit]).tolist()
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


@torch.no_grad()
def pretest(parts, span: Span, length: int, limit: float, chunk: int = 8192) -> list[torch.Tensor]:
    """Per position below `length`, the ids (ascending) of the tokens whose layer-1 input of
    LayerNorm(token + position) (parts = token rows, position rows, the LayerNorm) may lie within `limit`."""
    tok, pos, norm = parts
    d = tok.shape[1]
    gamma = norm.weight.float() if norm.weight is not None else tok.new_ones(d)
    beta = norm.bias.float() if norm.bias is not None else tok.new_zeros(d)
    cp = pos[:length].float()
    cp = cp - cp.mean(1, keepdim=True)
    b = span.mapped(cp * gamma)
    rb = span.residual(b)
    e = span.mapped(beta[None])
    re = span.residual(e)
    back = lambda y: gamma * span.mapped_adjoint(y, d)   # noqa: E731  c . back(y) == M(gamma c) . y
    cols = torch.cat([cp, back(b), back(rb), back(e), back(re)]).T.contiguous()
    f64 = lambda x: x.double()   # noqa: E731
    cp2, b2, rb2 = f64(cp.pow(2).sum(1)), f64(b.pow(2).sum(1)), f64(rb.pow(2).sum(1))
    eb, reb = f64(b @ e[0]), f64(rb @ re[0])
    e2, re2 = float(e.pow(2).sum()), float(re.pow(2).sum())
    n = len(cp)
    keep = []
    for s in range(0, tok.shape[0], chunk):
        c = tok[s:s + chunk].float()
        c = c - c.mean(1, keepdim=True)
        a = span.mapped(c * gamma)
        x = f64(c @ cols)
        xc, xb, xrb, xe, xre = x[:, :n], x[:, n:2 * n], x[:, 2 * n:3 * n], x[:, 3 * n:3 * n + 1], x[:, 3 * n + 1:]
        s2 = (f64(c.pow(2).sum(1))[:, None] + 2 * xc + cp2) / d + norm.eps
        sig = s2.sqrt()
        full = f64(a.pow(2).sum(1))[:, None] + 2 * xb + b2 + 2 * sig * (xe + eb) + s2 * e2
        off = f64(span.residual_sq(a))[:, None] + 2 * xrb + rb2 + 2 * sig * (xre + reb) + s2 * re2
        keep.append(off <= limit ** 2 * full)
    mask = torch.cat(keep)
    return [torch.nonzero(mask[:, p]).flatten() for p in range(n)]
