"""DAGER (Petrov et al., NeurIPS 2024): exact text recovery from transformer gradients.

The gradient of the first layers' attention input projections has its rows in the span of
the layer inputs. The attack estimates that span's rank (singular values above `rank_tol`,
default sigma_max * 10 * eps: attacks/dager/span.py says why not numpy's rule; the maximum
over the first ten layers, capped at width - `rank_cutoff`, plus `fedavg_extra_rank` for a multi-step delta as the official code adds 60), keeps every
vocabulary token whose layer-1 input lies within `l1_span_thresh` of the layer-1 span at
each position, then assembles sentences at layer 2 (attacks/dager/layer1.py, dager_decoder.py, dager_search.py). The output
is B sentences, exact ones first. Defaults are the official ones (l1 1e-5, l2 1e-3,
distinct 0.7, rank_cutoff 20).

Saturation: once the rank reaches the cap, the span holds no room for every true input and
its complement is too narrow to push false ones past `l2_span_thresh` (d = 768, B = 32: 20
directions left; a batch with every sentence passing scored ROUGE-1 0.37). The same holds when
more than 20,000 prefixes pass layer 2 at one step: the decoder search stops there
(`saturated_at`, attacks/dager/decoder.py). Such a batch is flagged `saturated`, its `exact`
count is 0 (`passed_l2` keeps how many passed) and the metric saturated_fraction reports the
share of batches flagged.

Update to gradient: -update / (lr * local steps), exact for FedSGD; for FedAvg this is
DAGER's pseudo-gradient (weight delta / (lr * epochs * minibatches)).

Partial views (e.g. MaskCrypt): a hidden entry is unknown. Rows of the gradient (in
"rows span the inputs" orientation) with any hidden entry are dropped, or, when that
leaves fewer rows than the rank, the input coordinates (columns) with any hidden entry
are dropped instead and candidates are compared on the remaining coordinates only —
whichever keeps the larger fully visible block. The attack then runs on that block; when
no fully visible block remains for layer 1 or 2 it returns empty sentences.

Gaussian noise (`noise_filter=True`, decoders only, as in the official code): distances
are logit-transformed and z-scored; at position 0 tokens below -`std_thresh` sigma are
kept, elsewhere the max(50 B, 5 % of the vocabulary) closest; at layer 2 the extensions
whose mean distance is an outlier below -`std_thresh` sigma (at most B per step) survive.

LoRA (`lora_path`, attacks/dager/arch.py): "auto" reads grad A when the start B is non-zero and the
start A is known and fully visible, else grad B; "factor-a" always reads grad A (B^T G X^T: zero while
B = 0, so a first round from the usual B = 0 init yields nothing; hidden columns of A drop those input
coordinates); "factor-b" always reads grad B (G (A X)^T) through the A the client started from, as the
server knows it from everything it holds: the global A it sent, or, where clients draw A themselves and
the start B is 0, the plaintext columns of the uploaded A; the columns hidden in both are solved for
(attacks/dager/hidden.py says how and why not dropped; `solved` in the record: candidates the fit holds
on per layer, 0 when it could not be confirmed). The two factor paths give the two readings of an attack
on LoRA that SHE-LoRA's evaluation distinguishes (leaderboards/suites/she-lora-paper.toml).

Where the server does not know the weights the client started from (beyond a LoRA A beside a zero B: SHE-LoRA
after its first upload), the second stage, which orders tokens through layer 1, cannot run; the first can, on
grad A: attacks/dager/tokens.py reads the set of tokens from the upload's plaintext columns of layer 0's A and
the row space the server's own plaintext sum gives its start (`token_span_thresh`, 0.05 by default). Such a
reconstruction holds no sentences, only the set (extra "tokens"), scored by the token metrics of
metrics/text.py; every DAGER run reports its layer-1 set there too.

Blocked by design when the view is empty, the model is not a GPT-2, BERT or LLaMA layout, the
first two layers' projection gradients are entirely hidden, the server does not know the weights
the client started from and cannot read even the token set (grad B's path, no estimate of the start A, layer 0's
inputs through unknown weights), or the path's factor A is wholly unknown.
"""
from __future__ import annotations

import time

import torch

from attacks.dager import hidden as dager_hidden
from attacks.dager import tokens as dager_tokens
from attacks.dager.arch import Arch
from attacks.dager.noise import noisy_decoder_search, noisy_layer1_tokens
from attacks.dager.decoder import decoder_search
from attacks.dager.layer1 import layer1_tokens
from attacks.dager.search import assemble, encoder_search
from attacks.dager.span import make_span, rank_of, spectrum
from bench.models import torch_device
from bench.protocol.attack import Attack, Reconstruction, Setting
from bench.protocol.evidence import Evidence, metric
from bench.protocol.view import Knowledge, ServerView, load
from bench.registry import ATTACKS

LORA_PATHS = ("auto", "factor-a", "factor-b")


@metric("saturated_fraction", "", None, "privacy", "fraction of attacked batches where the span no longer "
        "separates true from false sentences (its rank reached the cap, width - rank_cutoff, or more than 20,000 "
        "prefixes passed layer 2 at one step), so DAGER counts none of their sentences as exact",
        display="saturated")
def saturated_fraction(ev: Evidence) -> float | None:
    extra = ev.reconstruction.extra if ev.reconstruction is not None else {}
    return float(extra["saturated"]) if "saturated" in extra else None


def visible_block(grad: torch.Tensor, visible: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The largest of two fully visible blocks: all columns of the fully visible rows, or all rows on the
    fully visible columns; returns (block, kept column indices or None when all columns are kept)."""
    if bool(visible.all()):
        return grad, None
    rows = visible.all(1)
    cols = visible.all(0)
    by_rows = int(rows.sum()) * grad.shape[1]
    by_cols = grad.shape[0] * int(cols.sum())
    if min(int(rows.sum()), grad.shape[1]) >= min(grad.shape[0], int(cols.sum())) and by_rows > 0:
        return grad[rows], None
    if by_cols == 0:
        return grad[:0], None
    idx = torch.nonzero(cols).flatten()
    return grad[:, idx], idx


@ATTACKS.register("dager", "DAGER: exact text from the span of the first layers' gradients (GPT-2, BERT, LLaMA, LoRA)")
class Dager(Attack):
    links = {
        "paper": "https://arxiv.org/abs/2405.15586",
        "code": "https://github.com/insait-institute/dager-gradient-inversion",
    }
    family = "text"

    def __init__(self, rank_tol: float | None = None, rank_cutoff: int = 20, l1_span_thresh: float = 1e-5,
                 l2_span_thresh: float = 1e-3, distinct_thresh: float = 0.7, max_combinations: int = 4096,
                 fedavg_extra_rank: int = 60, noise_filter: bool = False, std_thresh: float = 5.0,
                 device: str = "cpu", lora_path: str = "auto",
                 token_span_thresh: float = dager_tokens.SPAN_THRESH) -> None:
        if l1_span_thresh <= 0 or l2_span_thresh <= 0 or token_span_thresh <= 0:
            raise ValueError("l1_span_thresh, l2_span_thresh and token_span_thresh must be > 0")
        if lora_path not in LORA_PATHS:
            raise ValueError(f"lora_path '{lora_path}' must be one of {', '.join(LORA_PATHS)}")
        if device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got '{device}'")
        super().__init__(rank_tol=rank_tol, rank_cutoff=rank_cutoff, l1_span_thresh=l1_span_thresh,
                         l2_span_thresh=l2_span_thresh, distinct_thresh=distinct_thresh,
                         max_combinations=max_combinations, fedavg_extra_rank=fedavg_extra_rank,
                         noise_filter=noise_filter, std_thresh=std_thresh, device=device, lora_path=lora_path,
                         token_span_thresh=token_span_thresh)
        self.rank_tol, self.rank_cutoff = rank_tol, rank_cutoff
        self.l1, self.l2, self.distinct = l1_span_thresh, l2_span_thresh, distinct_thresh
        self.max_combinations, self.fedavg_extra_rank = max_combinations, fedavg_extra_rank
        self.noise_filter, self.std_thresh = noise_filter, std_thresh
        self.pinned = device
        self.lora_path = lora_path
        self.token_thresh = token_span_thresh

    def device(self, model: torch.nn.Module) -> str:
        """`device = "cuda"` pins the GPU where there is one; the default follows the run's --device."""
        return "cuda" if self.pinned == "cuda" and torch.cuda.is_available() else torch_device.device_name(model)

    # -- threat model ----------------------------------------------------------------------------
    def applicable(self, setting: Setting) -> str | None:
        knowledge = setting.knowledge
        if knowledge.tokenizer is None or len(knowledge.input_shape) != 1:
            return f"needs tokenized text, this scenario's inputs have shape {knowledge.input_shape}"
        try:
            arch = Arch(setting.model, pad_id=-1)
        except ValueError as err:
            return str(err)
        if len(arch.layers) < 2:
            return "needs at least two transformer layers"
        if any(n not in knowledge.global_params for p in arch.layers[:2] for n in p.grad_names):
            return f"the first two layers' projections of model '{knowledge.model_name}' are not trained, so no " \
                   "gradient of them is ever sent"
        if self.noise_filter and arch.kind == "encoder":
            return "the noise-robust filtering is decoder-only (as in the official code)"
        if self.lora_path != "auto" and arch.layers[0].lora_a is None:
            return f"lora_path = '{self.lora_path}' reads LoRA factors; model '{knowledge.model_name}' has none on " \
                   "the projections DAGER reads (use lora_path = 'auto')"
        return None

    def blocked(self, view: ServerView, knowledge: Knowledge) -> str | None:
        if view.visible_fraction() == 0.0:
            return "the server view is empty: every entry is encrypted or kept local"
        start, reason = dager_hidden.start_weights(view, knowledge)
        if reason:   # the second stage cannot run; the first may (attacks/dager/tokens.py)
            model = load(knowledge, knowledge.global_params)   # unknown entries stay NaN
            arch = Arch(model, pad_id=-1)
            if not bool(torch.isfinite(arch.layer1_candidates(0, slice(0, 8))).all()):
                return f"{reason}, and layer 0's inputs pass through weights it does not know"
            return dager_tokens.blocked(view, knowledge, arch.layers, self.lora_path, reason)
        layers = Arch(knowledge.build_model(), pad_id=-1).layers[:2]
        names = [n for p in layers for n in ((p.lora_a,) if self.lora_path == "factor-a" else p.grad_names)]
        if any(n not in view.visible for n in names):
            return "the defense's model does not train the first two layers' projections, so their gradients are " \
                   "not sent"
        if all(not bool(view.visible[n].any()) for n in names):
            return "the first two layers' projection gradients are entirely hidden from the server"
        lora = [p.lora_a for p in layers if p.lora_a is not None]
        if self.lora_path == "factor-a" and any(bool(torch.isnan(knowledge.global_params[a]).any()) for a in lora):
            return "grad A needs the A the client started from, and its clients draw A and never send it"
        if self.lora_path != "factor-a" and any(len(dager_hidden.hidden_columns(start[a])) == start[a].shape[1]
                                                for a in lora):
            return "no column of A on the projections DAGER reads is known to the server (drawn by the client and " \
                   "encrypted in the upload)"
        return None

    # -- the attack --------------------------------------------------------------------------------
    def run(self, view: ServerView, knowledge: Knowledge, seed: int) -> Reconstruction:
        torch.manual_seed(seed)
        start = time.perf_counter()
        weights, unknown = dager_hidden.start_weights(view, knowledge)
        if unknown:
            return self._token_set(view, knowledge)
        model = knowledge.build_model()
        state = dict(model.named_parameters()) | dict(model.named_buffers())
        with torch.no_grad():
            for name, value in weights.items():   # an unknown A sits beside a zero B: it does not act
                state[name].copy_(torch.nan_to_num(value, nan=0.0))
        model.eval().to(self.device(model))
        tok = knowledge.tokenizer
        arch = Arch(model, int(tok.pad_token_id))
        spans, rank, widths, saturated = self._spans(view, knowledge, arch, state, weights)
        timings = {"span_s": time.perf_counter() - start}
        extra = {"matching": arch.kind, "rank": rank, "block_width": widths, "saturated": saturated}
        if spans is None:
            return Reconstruction(texts=[""] * knowledge.batch_size, extra=extra | {"exact": 0, "passed_l2": 0,
                                                                                    "tokens": []} | timings)
        drop = arch.special_ids(tok)
        max_len = min(knowledge.input_shape[0], getattr(model, "max_positions", knowledge.input_shape[0]))
        t = time.perf_counter()
        stopped = None   # the step where the decoder search stopped for layer-2 saturation
        for i, span in enumerate(spans):   # scalars, so the record keeps them: hidden columns, and candidates the
            if span.hidden is not None:     # solved columns hold on (0: not solved, see attacks/dager/hidden.py)
                extra[f"hidden_columns_l{i + 1}"], extra[f"solved_l{i + 1}"] = len(span.hidden), 0
        if self.noise_filter:
            tokens = noisy_layer1_tokens(arch, spans[0], max_len, drop, knowledge.batch_size, self.std_thresh)
            timings["layer1_s"] = time.perf_counter() - t
            exact, approx = noisy_decoder_search(arch, spans[1], tokens, knowledge.batch_size, self.std_thresh)
        else:
            if spans[0].hidden is not None:
                need = 4 * (len(spans[0].hidden) + dager_hidden.MARGIN)
                pool = dager_hidden.layer1_pool(arch, spans[0], max_len, 2 * knowledge.batch_size, need)
                extra["solved_l1"] = dager_hidden.solve(spans[0], pool, max(self.l1, 1e-4))
            tokens, specials = layer1_tokens(arch, spans[0], self.l1, max_len, drop)
            timings["layer1_s"] = time.perf_counter() - t
            if spans[1].hidden is not None and arch.kind == "decoder":
                pool = dager_hidden.layer2_pool(arch, spans[1], tokens, knowledge.batch_size,
                                                len(spans[1].hidden) + dager_hidden.MARGIN)
                extra["solved_l2"] = dager_hidden.solve(spans[1], pool, self.l2) or \
                    dager_hidden.anchored(arch, spans[1], tokens, knowledge.batch_size, self.l2)
            if arch.kind == "decoder":
                exact, approx, stopped = decoder_search(arch, spans[1], tokens, knowledge.batch_size, self.l2,
                                                        self.distinct)
            else:
                ends = [p for p, hits in enumerate(specials) if tok.sep_token_id in hits and p > 1]
                exact, approx = encoder_search(arch, spans[1], tokens, ends, tok.cls_token_id, tok.sep_token_id,
                                               knowledge.batch_size, self.max_combinations, self.distinct), []
        timings["layer2_s"] = time.perf_counter() - t - timings["layer1_s"]
        chosen, n_exact = assemble(exact, approx, knowledge.batch_size, self.l2, self.distinct)
        texts = [tok.decode(s, skip_special_tokens=True) for s in chosen]
        texts += [""] * (knowledge.batch_size - len(texts))
        saturated = saturated or stopped is not None
        extra |= {"saturated": saturated, "saturated_at": stopped, "exact": 0 if saturated else n_exact,
                  "passed_l2": n_exact, "tokens": sorted({t for ts in tokens for t in ts}),
                  "layer1_tokens": [len(t) for t in tokens]} | timings
        lora_a = arch.layers[0].lora_a
        if knowledge.uploads_weights and lora_a is not None and spans[0].transform is None:
            # grad A as the difference of two float32 copies of A: its set as the token stage reads it (tokens.py)
            extra["tokens"], _ = dager_tokens.token_set(view, weights[lora_a], arch, self.token_thresh,
                                                        self.rank_cutoff, drop, max_len)
        return Reconstruction(texts=texts, extra=extra)

    def _token_set(self, view: ServerView, knowledge: Knowledge) -> Reconstruction:
        """The first stage alone, where the start weights are unknown (attacks/dager/tokens.py): no sentences."""
        start = time.perf_counter()
        model = load(knowledge, knowledge.global_params)   # layer 0's inputs need none of the unknown entries
        model.to(self.device(model))
        tok = knowledge.tokenizer
        arch = Arch(model, int(tok.pad_token_id))
        max_len = min(knowledge.input_shape[0], getattr(model, "max_positions", knowledge.input_shape[0]))
        start_a = dager_tokens.start_a(knowledge, arch.layers[0].lora_a)
        bag, info = dager_tokens.token_set(view, start_a, arch, self.token_thresh, self.rank_cutoff,
                                           arch.special_ids(tok), max_len)
        return Reconstruction(extra=info | {"matching": arch.kind, "tokens": bag,
                                            "layer1_s": time.perf_counter() - start})

    def _spans(self, view: ServerView, knowledge: Knowledge, arch: Arch, state: dict, weights: dict | None = None):
        """Spans of layers 1 and 2 at the estimated rank, or None when a layer has no visible block; `weights`:
        the start weights as the server knows them (dager_hidden.start_weights)."""
        weights = weights if weights is not None else dager_hidden.start_weights(view, knowledge)[0]
        blocks = []
        for proj in arch.layers[:10]:
            if any(n not in view.values for n in proj.grad_names):
                break
            flip = (lambda t: t.T) if proj.transpose else (lambda t: t)   # noqa: E731
            grad = torch.cat([flip(knowledge.gradient(view, n)) for n in proj.grad_names])   # rows stacked
            visible = torch.cat([flip(view.visible[n]) for n in proj.grad_names]) & ~torch.isnan(grad)
            transform = None
            if proj.lora_a is not None:
                grad_a = knowledge.gradient(view, proj.lora_a)
                a_visible = view.visible[proj.lora_a] & ~torch.isnan(grad_a)
                b_zero = float(state[proj.grad_name].detach().abs().max()) == 0
                if self.lora_path == "factor-a" or (self.lora_path == "auto" and bool(a_visible.all()) and not b_zero):
                    grad, visible = grad_a, a_visible   # grad A spans the inputs
                else:                                  # grad B spans {A x}: candidates go through the start A
                    transform = weights[proj.lora_a].detach().float()
            block, coords = visible_block(grad, visible)
            blocks.append((block, coords, transform))
        ranks, vectors = [], []
        for block, coords, _ in blocks:
            if block.numel() == 0 or not bool(torch.nan_to_num(block).abs().max() > 0):   # nothing to span
                ranks.append(0)
                vectors.append(None)
                continue
            singular, vecs = spectrum(block)
            ranks.append(rank_of(singular, tuple(block.shape), self.rank_tol))
            vectors.append(vecs)
        widths = [int(b.shape[1]) for b, _, _ in blocks]
        if len(blocks) < 2 or vectors[0] is None or vectors[1] is None:
            return None, 0, widths, False
        rank = max(ranks)
        if knowledge.update_kind == "delta":
            rank += self.fedavg_extra_rank
        cap = min(widths[:2]) - self.rank_cutoff
        rank = max(1, min(rank, cap))
        spans = []
        for (block, coords, transform), vecs in zip(blocks[:2], vectors[:2]):
            hidden = None
            if transform is not None:
                hidden = dager_hidden.hidden_columns(transform if coords is None else transform[coords])
                hidden = hidden.to(arch.device) if len(hidden) else None
                transform = torch.nan_to_num(transform, nan=0.0).to(arch.device)   # unknown columns start dropped
            span = make_span(vecs.to(arch.device), rank, transform,
                             coords.to(arch.device) if coords is not None else None, hidden)
            spans.append(span)
        return spans, rank, widths, rank >= cap
