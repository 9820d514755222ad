"""What DAGER needs to know about a transformer: which gradients to read and the inputs of layers 1 and 2.

Two layouts are known, found by module type rather than by parameter-index lists:
GPT-2 (the fused attention input projection `attn.c_attn`, input ln_1(wte[t] + wpe[p]))
and BERT (`attention.self.query`, input LayerNorm(word[t] + type[0] + pos[p])). With
LoRA on the projection the gradient of A (r x d) = B^T G X^T has rows in the span of the
inputs whenever the global B != 0 (and A is fully visible); at B = 0 (the LoRA init, so every
first round) grad A is zero, or pure noise under a noise defense, and we read grad B (d_out x r)
= G (A X)^T, whose rows lie in the span of {A x_t}: candidates are then mapped through the known
A. The choice follows the global B the server sent, never the (possibly noised) upload. Either
way the span test needs r > the number of tokens.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


class _Stop(Exception):
    """Raised by a hook to end a forward pass once the wanted layer input is captured."""


@dataclass
class Projection:
    """One layer's attention input projection as DAGER reads it."""

    module: nn.Module            # the module whose input is the layer input
    grad_name: str               # parameter whose gradient is read
    transpose: bool              # Conv1D stores (in, out): rows in span after transposing
    lora_a: str | None = None    # set when grad rows live in span{A x}: name of A's weight


class Arch:
    """Layer inputs of a known transformer; `kind` is decoder (causal) or encoder (bidirectional)."""

    def __init__(self, model: nn.Module, pad_id: int):
        from transformers import BertModel, GPT2Model
        self.model = model
        self.pad_id = pad_id
        names = {id(p): n for n, p in model.named_parameters()}
        gpt = [m for m in model.modules() if isinstance(m, GPT2Model)]
        bert = [m for m in model.modules() if isinstance(m, BertModel)]
        if gpt:
            self.kind, self.core = "decoder", gpt[0]
            mods = [block.attn.c_attn for block in self.core.h]
        elif bert:
            self.kind, self.core = "encoder", bert[0]
            mods = [layer.attention.self.query for layer in self.core.encoder.layer]
        else:
            raise ValueError(f"{type(model).__name__} is not a transformer DAGER knows (GPT-2 or BERT)")
        self.layers = [self._projection(m, names) for m in mods]

    @staticmethod
    def _projection(module: nn.Module, names: dict[int, str]) -> Projection:
        if hasattr(module, "lora_A") and "default" in getattr(module, "lora_A", {}):
            a, b = module.lora_A["default"].weight, module.lora_B["default"].weight
            return Projection(module, names[id(b)], False, lora_a=names[id(a)])
        weight = module.weight
        return Projection(module, names[id(weight)], type(module).__name__ == "Conv1D")

    # -- special tokens -------------------------------------------------------------------------
    def special_ids(self, tokenizer) -> set[int]:
        return set(getattr(tokenizer, "all_special_ids", [])) | {self.pad_id}

    # -- layer 1: every vocabulary token at one position -----------------------------------------
    @torch.no_grad()
    def layer1_candidates(self, position: int, rows: slice) -> torch.Tensor:
        """Layer-1 projection inputs of vocabulary tokens rows at `position`, shape (n, d)."""
        if self.kind == "decoder":
            h = self.core.wte.weight[rows] + self.core.wpe.weight[position]
            return self.core.h[0].ln_1(h)
        emb = self.core.embeddings
        h = emb.word_embeddings.weight[rows] + emb.token_type_embeddings.weight[0] + \
            emb.position_embeddings.weight[position]
        return emb.LayerNorm(h)

    def vocab_size(self) -> int:
        return (self.core.wte if self.kind == "decoder" else self.core.embeddings.word_embeddings).weight.shape[0]

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
