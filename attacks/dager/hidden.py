"""DAGER's LoRA factor-b path when the server knows only some columns of A: solve for the others.

Which A. grad B = G (A X)^T, with A the adapter the client started the step from. The server takes it from
the global model it sent where it knows it; where it does not (a client-drawn A0, SHE-LoRA's official
protocol) and the start B beside it is zero, from the upload itself: a step from B = 0 leaves A unchanged
(grad A = B^T G X^T = 0), so the plaintext columns of the uploaded A are the start's. Under FedAvg only the
first step does; that reading is DAGER's pseudo-gradient approximation there. Columns hidden in both stay
unknown (`start_weights`).

Why solve rather than drop. A token x is in the span S of grad B's rows iff A_K x_K + A_U x_U lies in S (K
the known columns, U the k unknown). Dropping U (testing A_K x_K against S) is exact only while A_U x_U is
negligible, and SHE-LoRA's rule hides exactly the columns where it is not: the importance sum_k |A_kj| ||x_j||
picks the largest input features. On SmolLM2's layer 0 (the Table 2 setting), one hidden column of 576 holds
28 % of the input energy and 5 columns (gamma = 1 %) 51 %; in layer 1, 71 % and 75 % (measured on 32 SST-2
sentences). So the k columns are solved for: with P the projection off S, a true token satisfies
P A_K x_K = -(P A_U) x_U, linear in the unknown W = P A_U (r x k) with x_U known for every candidate. The
candidates closest to S with U dropped are mostly true ones (measured: at gamma = 1 % the 50 closest of
49,152 tokens all are), so W is fitted by least squares on the q = k + `margin` closest and refined by
trimmed least squares (refit on the q closest under the fit) until the fit holds exactly (within `tol`) on
at least k + margin linearly independent candidates (k unknowns per coordinate). A fit on q > k independent exact
points does not happen by chance: each point beyond k checks r - rank equations. Then A_U := W, whose part in
S is left 0 (it changes only the norm a candidate's distance is divided by). When fewer than k + margin
true inputs exist (k above the batch's distinct tokens: at gamma = 20 %, 115 columns) no fit confirms and the
columns stay dropped, so the test finds nothing; `solved` records it. Layer 1's candidates are the
vocabulary's layer-1 inputs; layer 2's (decoders only) are the inputs of a beam of prefixes over the layer-1
tokens, ranked the same way, and where that ranking is too weak (SmolLM2's second layer) `anchored` fits W on
the first tokens and finds the one direction they leave free from the pairs that agree on it.
"""
from __future__ import annotations

import torch

from attacks.dager.arch import Arch
from attacks.dager.layer1 import layer1_distances
from attacks.dager.span import Span

MARGIN = 3        # points beyond k that a fit must also hold on
BEAM = 4          # prefixes kept per step when collecting layer-2 inputs (times the batch size)


def start_weights(view, knowledge) -> tuple[dict[str, torch.Tensor], str | None]:
    """The weights the attacked client started from as the server knows them (NaN where it does not), and a
    reason when an entry other than a LoRA A beside a zero start B is unknown."""
    out = {}
    for name, value in knowledge.global_params.items():
        unknown = torch.isnan(value)
        if not bool(unknown.any()):
            out[name] = value
            continue
        partner = name.replace(".lora_A.", ".lora_B.") if ".lora_A." in name else None
        start_b = knowledge.global_params.get(partner) if partner else None
        if start_b is None or not bool((start_b == 0).all()):
            return out, "the server does not know the current global weights (clients decrypt them)"
        seen = view.values.get(name, torch.full_like(value, float("nan")))
        out[name] = torch.where(unknown, seen.to(value.dtype), value)
    return out, None


def hidden_columns(a: torch.Tensor) -> torch.Tensor:
    """Columns of A (r x n) with an unknown entry in a row the server knows anything of (rows it knows nothing
    of, e.g. above a client's rank, are dropped with grad B's unseen columns)."""
    rows = ~torch.isnan(a).all(1)
    if not bool(rows.any()):
        return torch.arange(a.shape[1])
    return torch.nonzero(torch.isnan(a[rows]).any(0)).flatten()


def _parts(span: Span, inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(inputs, A_K x_K on the kept rows, its part off the span, x_U) per candidate, float64; near-duplicates
    removed (a prefix of one repeated token has its first token's input up to rounding)."""
    v = _distinct(inputs.float())
    mapped = span.mapped(v)
    return v.double(), mapped.double(), span.residual(mapped).double(), v[:, span.hidden].double()


def _independent(v: torch.Tensor, tol: float = 1e-4) -> int:
    """How many of the inputs are linearly independent (unit rows, singular values above tol of the largest).
    A fit confirms only on more independent inputs than unknowns: any k independent inputs fit exactly, and
    a family of nearly dependent ones (a token and its repetitions) adds nothing to that (measured: 8 inputs
    of rank 5 passed a fit of k = 5 at 1e-11)."""
    if not len(v):
        return 0
    sv = torch.linalg.svdvals(v / v.norm(dim=-1, keepdim=True).clamp_min(1e-30))
    return int((sv > tol * sv[0]).sum())


def _distinct(v: torch.Tensor, tol: float = 1e-4) -> torch.Tensor:
    """Rows of v, each kept unless it lies within tol (relative) of an earlier kept row."""
    unit = v / v.norm(dim=-1, keepdim=True).clamp_min(1e-30)
    close = (torch.cdist(unit, unit) < tol).cpu()
    keep = torch.ones(len(v), dtype=torch.bool)
    for i in range(len(v)):
        if keep[i]:
            keep[i + 1:] &= ~close[i, i + 1:]
    return v[keep.to(v.device)]


def _dist(mapped, r, u, wt) -> torch.Tensor:
    """Each candidate's distance to the span once the hidden columns hold W (W^T = wt, k x r'), relative to its
    known part A_K x_K: relative to the whole A x, a fit with a huge W (q points nearly dependent in x_U)
    would pass any candidate."""
    return (r + u @ wt).norm(dim=-1) / mapped.norm(dim=-1).clamp_min(1e-30)


def _commit(span: Span, mapped, r, u, inliers: torch.Tensor) -> int:
    """Refit W on the inliers and write it into the transform's hidden columns (its part in the span 0)."""
    wt = -torch.linalg.lstsq(u[inliers], r[inliers]).solution
    rows = span.coords if span.coords is not None else slice(None)
    block = span.transform[rows]
    block[:, span.hidden] = wt.T.to(block.dtype).to(block.device)
    span.transform[rows] = block
    return int(len(inliers))


def solve(span: Span, inputs: torch.Tensor, tol: float, margin: int = MARGIN, rounds: int = 20) -> int:
    """Fill span.transform's hidden columns from candidate inputs (N, n) by trimmed least squares from the
    closest with those columns dropped; returns how many candidates the confirmed fit holds on (0: none
    confirmed, the columns stay 0, i.e. dropped)."""
    v, mapped, r, u = _parts(span, inputs)
    q = len(span.hidden) + margin
    if len(r) < q:
        return 0
    sel = torch.argsort(r.norm(dim=-1) / mapped.norm(dim=-1).clamp_min(1e-30))[:q]
    for _ in range(rounds):
        dist = _dist(mapped, r, u, -torch.linalg.lstsq(u[sel], r[sel]).solution)
        inliers = torch.nonzero(dist < tol).flatten()
        if _independent(v[inliers]) >= q and bool((dist[sel] < tol).all()):
            return _commit(span, mapped, r, u, inliers)
        new = torch.argsort(dist)[:q]
        if set(new.tolist()) == set(sel.tolist()):
            return 0
        sel = new
    return 0


def _layer2(arch: Arch, span: Span, prefixes: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Layer-2 inputs at the last position of each prefix, with their (mapped, residual, x_U) in float64."""
    x = torch.cat([arch.layer_inputs(prefixes[s:s + 256], layer=1)[:, -1] for s in range(0, len(prefixes), 256)])
    mapped = span.mapped(x)
    return x, mapped.double(), span.residual(mapped).double(), x[:, span.hidden].double()


@torch.no_grad()
def anchored(arch: Arch, span: Span, tokens: list[list[int]], batch_size: int, tol: float,
             margin: int = MARGIN, cluster: float = 1e-2) -> int:
    """Layer 2 of a decoder when the closest-first ranking is too weak (SmolLM2's layer 1: true pairs rank
    28th to 3,384th of 4,225): anchor on the a = min(k - 1, B) first tokens whose position-0 inputs are closest
    (there the ranking holds: the true ones rank first at gamma = 1 %), fit W on them up to the one direction
    xi of x_U they leave free, so a true pair's reduced residual rho satisfies rho = -c (xi . x_U) for one
    unknown c: the pairs whose rho / (xi . x_U) coincide (within `cluster`, relative) give c (with one hidden
    column no anchor is needed: the position-0 inputs share it). The fit then grows along the prefixes it
    accepts until it holds on k + margin inputs; 0 when it does not."""
    k, a = len(span.hidden), min(len(span.hidden) - 1, batch_size, len(tokens[0]) if tokens else 0)
    if len(tokens) < 2:
        return 0
    dev = arch.device
    firsts = torch.tensor(tokens[0], device=dev)
    x0, m0, r0, u0 = _layer2(arch, span, firsts[:, None])
    if a == 0:   # one hidden column: the position-0 inputs themselves share rho / x_U
        if k != 1:
            return 0
        xi, wt0, cand = u0.new_ones(1), r0.new_zeros(1, r0.shape[1]), firsts[:, None]
        x1, m1, r1, u1 = x0, m0, r0, u0
    else:
        acc = torch.argsort(r0.norm(dim=-1) / m0.norm(dim=-1).clamp_min(1e-30))[:a]
        _, sv, vh = torch.linalg.svd(u0[acc])
        free = vh[int((sv > sv[0] * 1e-9).sum()):]
        if len(free) != 1:
            return 0
        xi, wt0 = free[0], -torch.linalg.pinv(u0[acc]) @ r0[acc]
        second = torch.tensor(tokens[1], device=dev)
        cand = torch.stack([firsts[acc].repeat_interleave(len(second)), second.repeat(a)], 1)
        x1, m1, r1, u1 = _layer2(arch, span, cand)
    scale = u1 @ xi
    z = (r1 + u1 @ wt0) / torch.where(scale.abs() > 1e-12, scale, torch.full_like(scale, 1e-12))[:, None]
    near = torch.cdist(z, z) < cluster * z.norm(dim=-1, keepdim=True)
    count = near.sum(1)
    if int(count.max()) < 2:
        return 0
    wt = wt0 - xi[:, None] * z[near[int(torch.argmax(count))]].mean(0)[None, :]
    inputs, prefixes = [x0, x1], cand[_dist(m1, r1, u1, wt) < tol]
    for p in range(cand.shape[1], len(tokens)):
        if not len(prefixes) or sum(len(x) for x in inputs) > 64 * (k + margin):
            break
        nxt = torch.tensor(tokens[p], device=dev)
        ext = torch.cat([prefixes.repeat_interleave(len(nxt), 0), nxt.repeat(len(prefixes)).unsqueeze(1)], 1)
        x, m, r, u = _layer2(arch, span, ext)
        inputs.append(x)
        prefixes = ext[_dist(m, r, u, wt) < tol]
    v, mapped, r, u = _parts(span, torch.cat(inputs))
    inliers = torch.nonzero(_dist(mapped, r, u, wt) < tol).flatten()
    if _independent(v[inliers]) < k + margin:
        return 0
    return _commit(span, mapped, r, u, inliers)


@torch.no_grad()
def layer1_pool(arch: Arch, span: Span, max_len: int, per_position: int, want: int) -> torch.Tensor:
    """Layer-1 inputs of the tokens closest to the span with the hidden columns dropped: the whole vocabulary
    once for position-free layouts, else the `per_position` closest at each position until `want` are held."""
    found = []
    for p in range(max_len):
        dist = layer1_distances(arch, span, p)
        take = want if arch.position_free else per_position
        ids = torch.argsort(dist)[:take]
        found.append(arch.layer1_candidates(p, ids))
        if arch.position_free or sum(len(f) for f in found) >= want:
            break
    return torch.cat(found)


@torch.no_grad()
def layer2_pool(arch: Arch, span: Span, tokens: list[list[int]], batch_size: int, need: int) -> torch.Tensor:
    """Layer-2 inputs along a beam of prefixes over the layer-1 tokens: each step extends the BEAM * batch_size
    prefixes closest to the span (hidden columns dropped) by every layer-1 token of the next position and keeps
    the closest again; a step holds at most batch_size true inputs, so it runs need / batch_size + 2 steps.
    Decoders only (a prefix's layer-2 inputs do not depend on later tokens)."""
    if not tokens:
        return torch.zeros(0, arch.layout.embedding.shape[1])
    width, dev = BEAM * batch_size, arch.device
    steps = min(len(tokens), -(-need // batch_size) + 2)
    prefixes = torch.tensor(tokens[0], device=dev).unsqueeze(1)
    found = []
    for p in range(steps):
        if p:
            cand = torch.tensor(tokens[p], device=dev)
            n, k = len(prefixes), len(cand)
            prefixes = torch.cat([prefixes.repeat_interleave(k, 0), cand.repeat(n).unsqueeze(1)], 1)
        x = torch.cat([arch.layer_inputs(prefixes[s:s + 256], layer=1)[:, -1] for s in range(0, len(prefixes), 256)])
        order = torch.argsort(span.distance(x))[:width]
        found.append(x[order])
        prefixes = prefixes[order]
    return torch.cat(found)
