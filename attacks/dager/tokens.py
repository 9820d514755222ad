"""DAGER's first stage alone: the set of tokens a client typed, where the server does not know the weights it
started from.

After a round whose aggregate the clients decrypt and re-factor (SHE-LoRA from its second upload on), the server
knows neither LoRA factor a client starts the step from, so DAGER's second stage, which orders the tokens through
layer 1's inputs, cannot run: those inputs pass through layer 0's unknown weights. Its first stage need not: layer
0's inputs are the public token embeddings through the frozen input norm, the same for every client.

grad A (lora_path factor-a or auto). One step from (B0, A0) uploads A1 = A0 - lr B0^T G X^T. The server does not
know A0, but it knows its row space on the columns it sees in clear: the client re-factors the decrypted aggregate,
whose plaintext columns the server summed itself (Knowledge.estimate: Defense.server_estimate). A0's rows are right
singular vectors of that Delta W (v = Delta W^T u / sigma), so on the plaintext columns K they lie in the row space
of Delta W_K, the server's own sum, which its estimate Â_K spans: rowspace(A0_K) is in rowspace(Â_K). With Q an
orthonormal basis of its complement, A1_K Q = -lr B0^T G X_K^T Q: its rows span {Q x_t,K} over the batch's tokens
t (local steps sum such terms: the same span), and a vocabulary token belongs to the batch iff Q x_K lies in that
span. x_K is known for every token, so no hidden column needs solving (the round-1 factor-b path solves for A's
hidden columns because there they sit inside the map A x; here they are only dropped coordinates of a known input).

Noise floor. A1 and the server's estimate are float32 weights, so the floor of A1_K Q's spectrum is their
rounding (about eps |A| per entry), far above the float32 eps of the gradient DAGER's thresholds assume. The rank
counts the singular values FLOOR_MARGIN above that floor as predicted from the upload's own entries (`_floor`), and
a token is kept within `thresh` of the span, the official code's LoRA threshold 0.05 (scripts/lora.sh). A rank
above width - rank_cutoff (DAGER's cap) reads nothing and is flagged saturated: the complement Q must be wider than
the batch's distinct tokens by that margin (n - r columns; at GPT-2 width 128 and r = 96 it is not). Measured on
GPT-2 (n_embd 128, r = 32, SHE-LoRA at gamma = 5 %, round 2, B = 1, tests/test_dager.py): 8 singular values from
3e-4 to 5.6e-7, then the floor from 7.6e-10 down (the predicted edge, 4x: about 3e-9); all 8 tokens, none
extra.

grad B (lora_path factor-b) reads B0 - B1, and B0 is known only up to its column space (the server's plaintext sum):
blocked by design.

Where the server knows A0 (Flex-LoRA after its first round), DAGER's own first stage reads grad A as (A0 - A1) / lr,
with the same float32 floor under thresholds made for an exact gradient (measured on that upload: rank 192 of
576, no token within 1e-5); the set it reports is then read here too, with A0 in place of the estimate
(attacks/dager/attack.py), so that both rows of a scenario are scored by one rule.
"""
from __future__ import annotations

import torch

from attacks.dager.arch import Arch
from attacks.dager.layer1 import layer1_tokens
from attacks.dager.span import make_span, rank_of, spectrum
from bench.protocol.view import Knowledge, ServerView

FLOOR_MARGIN = 4.0   # the rank counts singular values this far above the predicted rounding floor
SPAN_THRESH = 0.05   # the official code's LoRA span threshold (insait-institute/dager-gradient-inversion, lora.sh)


def _read(layers, view: ServerView) -> tuple[str | None, str | None]:
    """(name of layer 0's LoRA A, of its B) on the projection DAGER reads, or Nones without LoRA there."""
    proj = layers[0]
    return (proj.lora_a, proj.grad_name) if proj.lora_a is not None and proj.lora_a in view.values else (None, None)


def start_a(knowledge: Knowledge, a: str) -> torch.Tensor | None:
    """Layer 0's start A as the server knows it: the global A it sent, else its own estimate, else None."""
    known = knowledge.global_params[a]
    return known if not bool(torch.isnan(known).any()) else knowledge.estimate.get(a)


def blocked(view: ServerView, knowledge: Knowledge, layers, lora_path: str, unknown: str) -> str | None:
    """Why the token set cannot be read where the start weights are unknown (`unknown`: that reason), or None."""
    a, b = _read(layers, view)
    if a is None or start_a(knowledge, a) is None:
        return unknown
    if lora_path == "factor-b":
        est = knowledge.estimate.get(b)
        outputs = f" ({int(torch.linalg.matrix_rank(est.double()))} of its {est.shape[0]} output directions)" \
            if est is not None else ""
        return "grad B = (B_start - B_upload) / lr needs the B the client started from, which its clients rebuild " \
               f"from the decrypted aggregate; the server knows it only up to its column space{outputs}"
    rows, cols = _block(view, a)
    if cols is None:
        return "every column of A on layer 0's projection is hidden from the server"
    if _complement(start_a(knowledge, a), cols).shape[1] == 0:
        return "the start A's row space, as the server's sum gives it, fills every column it sees in clear"
    return None


def _block(view: ServerView, a: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The rows of A the client uses (any visible entry) and the columns visible in all of them (None: none)."""
    seen = view.visible[a] & ~torch.isnan(view.values[a])
    rows = seen.any(1)
    cols = seen[rows].all(0) if bool(rows.any()) else torch.zeros(seen.shape[1], dtype=torch.bool)
    return rows, (cols if bool(cols.any()) else None)


def _complement(start: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """An orthonormal basis (|K| x w) of the complement of the start A's row space on the columns K."""
    block = torch.nan_to_num(start.double()[:, cols])
    singular, vectors = spectrum(block)
    return vectors[:, rank_of(singular, tuple(block.shape), None):]


def _floor(block: torch.Tensor, upload: torch.Tensor) -> float:
    """The largest singular value float32 rounding gives the block: A1, A0 and the server's estimate of A0's row
    space each round at about eps |A| per entry (std eps rms(A) / sqrt(12) each), and an n x w matrix of such
    iid entries has its largest singular value near std (sqrt n + sqrt w); FLOOR_MARGIN over that, in the units of
    the upload's entries (`upload`: the rows and columns of A1 the block projects)."""
    rms = float(upload.double().pow(2).mean().sqrt())
    n, w = block.shape
    return FLOOR_MARGIN * torch.finfo(torch.float32).eps * rms * (n ** 0.5 + w ** 0.5)


def _rank(block: torch.Tensor, floor: float) -> tuple[int, float]:
    """The span's rank: the singular values above the rounding floor; and the ratio of the last one kept to the
    first one dropped (the gap the rank sits at: about 800 on SHE-LoRA's round 2, GPT-2 width 128 below)."""
    s = torch.linalg.svdvals(block)
    rank = int((s > floor).sum())
    return rank, float(s[rank - 1] / s[rank].clamp_min(1e-300)) if 0 < rank < len(s) else float("inf")


@torch.no_grad()
def token_set(view: ServerView, start: torch.Tensor, arch: Arch, thresh: float, rank_cutoff: int,
              drop: set[int], max_len: int) -> tuple[list[int], dict]:
    """The vocabulary tokens whose layer-0 input lies within `thresh` of the span of A1_K Q (`start`: layer 0's
    start A as the server knows it, start_a), and what decided it."""
    a, _ = _read(arch.layers, view)
    rows, cols = _block(view, a)
    basis = _complement(start, cols)                                         # |K| x w
    upload = view.values[a].double()[rows][:, cols]
    block = upload @ basis                                                   # rows span {Q x_t,K}
    width = basis.shape[1]
    rank, gap = _rank(block, _floor(block, upload))
    info = {"stage": "token set", "rank": rank, "gap": gap, "block_width": width, "columns_seen": int(cols.sum())}
    if rank > width - rank_cutoff:   # DAGER's cap: a span this wide holds tokens the batch does not
        return [], info | {"saturated": True, "tokens_found": 0}
    _, vectors = spectrum(block)
    transform = torch.zeros(width, view.values[a].shape[1], dtype=torch.float64)
    transform[:, cols] = basis.T                                             # x -> Q^T x_K
    span = make_span(vectors.to(arch.device), rank, transform.float().to(arch.device))
    per_position, _ = layer1_tokens(arch, span, thresh, max_len, drop)
    bag = sorted({t for tokens in per_position for t in tokens})
    return bag, info | {"saturated": False, "tokens_found": len(bag)}
