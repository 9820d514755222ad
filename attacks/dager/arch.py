"""What DAGER needs to know about a transformer: which gradients to read and the inputs of layers 1 and 2.

Three layouts are known, found by module type rather than by parameter-index lists:
GPT-2 (the fused attention input projection `attn.c_attn`, input ln_1(wte[t] + wpe[p])),
BERT (`attention.self.query`, input LayerNorm(word[t] + type[0] + pos[p])) and LLaMA
(`self_attn.q_proj`, input RMSNorm(embed[t]): position-free, attacks/dager/llama.py). With
LoRA on the projection the gradient of A (r x d) = B^T G X^T has rows in the span of the
inputs whenever the global B != 0 (and A is fully visible); at B = 0 (the LoRA init, so every
first round) grad A is zero, or pure noise under a noise defense, and we read grad B (d_out x r)
= G (A X)^T, whose rows lie in the span of {A x_t}: candidates are then mapped through the known
A. The choice follows the global B the server sent, never the (possibly noised) upload. Either
way the span test needs r > the number of tokens.

Decoders are causal, so extending a prefix by one token leaves the layer-2 inputs of the
earlier positions unchanged, and block 0's keys and values at a position depend on that
position's token alone. A decoder layout's `next_layer2_inputs` therefore runs block 0 for the
new position only, attending over the prefix's cached keys and values: one token's work per
extension instead of the whole prefix's. It calls the block's own modules (LoRA wrappers
included) and is checked against the full forward (`layer_inputs`) in the tests.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from attacks.dager.layouts import BertLayout, GPT2Layout, is_lora
from attacks.dager.llama import LlamaLayout
from bench.models.torch_device import native_bfloat16


class _Stop(Exception):
    """Raised by a hook to end a forward pass once the wanted layer input is captured."""


@dataclass
class Projection:
    """One layer's attention input projection(s) as DAGER reads them."""

    module: nn.Module            # the module whose input is the layer input
    grad_names: tuple[str, ...]  # parameters whose gradients are read, rows stacked (all take the layer input)
    transpose: bool              # Conv1D stores (in, out): rows in span after transposing
    lora_a: str | None = None    # set when grad rows live in span{A x}: name of A's weight

    @property
    def grad_name(self) -> str:
        return self.grad_names[0]


def _layouts() -> list[tuple[type, object]]:
    from transformers import BertModel, GPT2Model, LlamaModel

    return [(GPT2Model, GPT2Layout), (BertModel, BertLayout), (LlamaModel, LlamaLayout)]


class Arch:
    """Layer inputs of a known transformer; `kind` is decoder (causal) or encoder (bidirectional);
    `position_free` when the layer-1 inputs carry no position (rotary embeddings act after the projection)."""

    def __init__(self, model: nn.Module, pad_id: int):
        self.model = model
        self.pad_id = pad_id
        names = {id(p): n for n, p in model.named_parameters()}
        for cls, layout in _layouts():
            found = [m for m in model.modules() if isinstance(m, cls)]
            if found:
                self.layout = layout(found[0])
                break
        else:
            raise ValueError(f"{type(model).__name__} is not a transformer DAGER knows (GPT-2, BERT or LLaMA)")
        self.kind, self.position_free, self.core = self.layout.kind, self.layout.position_free, self.layout.core
        self.layers = [self._projection(m, names) for m in self.layout.projections]

    @staticmethod
    def _projection(modules: list[nn.Module], names: dict[int, str]) -> Projection:
        module = modules[0]
        if is_lora(module):
            a, b = module.lora_A["default"].weight, module.lora_B["default"].weight
            return Projection(module, (names[id(b)],), False, lora_a=names[id(a)])
        return Projection(module, tuple(names[id(m.weight)] for m in modules), type(module).__name__ == "Conv1D")

    # -- special tokens -------------------------------------------------------------------------
    def special_ids(self, tokenizer) -> set[int]:
        return set(getattr(tokenizer, "all_special_ids", [])) | {self.pad_id}

    # -- layer 1: every vocabulary token at one position -----------------------------------------
    @torch.no_grad()
    def layer1_candidates(self, position: int, rows: slice) -> torch.Tensor:
        """Layer-1 projection inputs of vocabulary tokens rows at `position`, shape (n, d)."""
        return self.layout.layer1_inputs(position, rows)

    def vocab_size(self) -> int:
        return self.layout.embedding.shape[0]

    @property
    def device(self) -> torch.device:
        return self.layout.embedding.device

    # -- layer 2, decoders: one new position at a time over cached block-0 keys and values ------------
    @torch.no_grad()
    def token_kv(self, tokens: torch.Tensor, position: int) -> tuple[torch.Tensor, ...]:
        """Block 0 at `position` for tokens (k,): embeddings (k, d) and per-head q, k, v (k, heads, head size);
        k and v have the key/value heads (fewer than q's under grouped-query attention), position applied."""
        return self.layout.token_kv(tokens, position)

    @torch.no_grad()
    def next_layer2_inputs(self, keys: torch.Tensor, values: torch.Tensor, step: tuple[torch.Tensor, ...],
                           chunk: int = 4096) -> torch.Tensor:
        """Layer-2 inputs (n, k, d) at the next position of n prefixes (keys, values: (n, p, kv heads, head
        size)) each extended by each of k candidate tokens (`step` = token_kv of the candidates there)."""
        return self.layout.next_layer2_inputs(keys, values, step, chunk)

    @torch.no_grad()
    def coarse_layer2_inputs(self, keys: torch.Tensor, values: torch.Tensor, step: tuple[torch.Tensor, ...],
                             chunk: int = 4096) -> torch.Tensor:
        """next_layer2_inputs with block 0's matrix products in bfloat16 (float32 accumulation, autocast):
        the search's pre-test (attacks/dager/decoder.py bounds the error); returned as float32. Where bfloat16 is
        emulated (a CPU without AVX512_BF16 or AMX, and every CPU on the pinned AVX2 path, bench/run/numerics.py)
        it would cost tens of times float32's products, so the pre-test is float32 there: the decoder's check
        then passes by construction and the sentences are the same."""
        if not native_bfloat16(self.device):
            return self.next_layer2_inputs(keys, values, step, chunk)
        with torch.autocast(self.device.type, dtype=torch.bfloat16):
            return self.layout.next_layer2_inputs(keys, values, step, chunk, coarse=True).float()

    def layer2_distances(self, keys: torch.Tensor, values: torch.Tensor, step: tuple[torch.Tensor, ...],
                         distance: Callable[[torch.Tensor], torch.Tensor], coarse: bool = False,
                         chunk: int = 4096) -> torch.Tensor:
        """distance() (n, k) of the layer-2 inputs next_layer2_inputs (or, coarse, coarse_layer2_inputs) gives,
        taken a block of about `chunk` (prefix, candidate) pairs at a time: the (n, k, d) grid of a late step
        (thousands of prefixes by thousands of candidates) would not fit in memory whole."""
        inputs = self.coarse_layer2_inputs if coarse else self.next_layer2_inputs
        per = max(1, chunk // max(1, len(step[0])))
        return torch.cat([distance(inputs(keys[s:s + per], values[s:s + per], step, chunk))
                          for s in range(0, max(1, len(keys)), per)])

    @torch.no_grad()
    def pair_layer2_inputs(self, keys: torch.Tensor, values: torch.Tensor, step: tuple[torch.Tensor, ...],
                           parents: torch.Tensor, children: torch.Tensor, chunk: int = 512) -> torch.Tensor:
        """Layer-2 inputs (m, d) of m single extensions: prefix parents[i] (of keys, values) by candidate
        children[i] (of step); what next_layer2_inputs gives for those pairs, without the rest of the grid."""
        out = [keys.new_zeros((0, self.layout.embedding.shape[1]))]
        for s in range(0, len(parents), chunk):
            pi, ci = parents[s:s + chunk], children[s:s + chunk]
            out.append(self.layout.pair_layer2_inputs(keys[pi], values[pi], tuple(t[ci] for t in step)))
        return torch.cat(out)

    # -- layer 2: inputs of the second layer's projection for whole sequences ---------------------
    @torch.no_grad()
    def layer_inputs(self, ids: torch.Tensor, layer: int = 1) -> torch.Tensor:
        """Inputs (N, L, d) of layer `layer`'s projection for unpadded sequences ids (N, L)."""
        captured = {}

        def hook(_module, args, kwargs):
            captured["x"] = (args[0] if args else kwargs["hidden_states"]).detach()
            raise _Stop

        handle = self.layers[layer].module.register_forward_pre_hook(hook, with_kwargs=True)
        try:
            self.core(input_ids=ids, attention_mask=torch.ones_like(ids))
        except _Stop:
            pass
        finally:
            handle.remove()
        return captured["x"]
