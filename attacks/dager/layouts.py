"""DAGER's GPT-2 and BERT layouts (the LLaMA one is attacks/dager/llama.py): where a transformer's first
layers take their inputs and, for decoders, one position's step through block 0 over cached keys and values
(attacks/dager/arch.py says why)."""
from __future__ import annotations

import torch
from torch import nn


def is_lora(module: nn.Module) -> bool:
    return hasattr(module, "lora_A") and "default" in getattr(module, "lora_A", {})


class GPT2Layout:
    """GPT-2: learned absolute positions added before ln_1; heads split the fused c_attn output."""

    kind, position_free = "decoder", False

    def __init__(self, core: nn.Module):
        self.core = core
        self.embedding = core.wte.weight
        self.projections = [[block.attn.c_attn] for block in core.h]

    def layer1_inputs(self, position: int, rows: slice) -> torch.Tensor:
        return self.core.h[0].ln_1(self.core.wte.weight[rows] + self.core.wpe.weight[position])

    def layer1_parts(self) -> tuple[torch.Tensor, torch.Tensor, nn.Module]:
        """Layer-1 inputs are norm(token rows[t] + position rows[p]) (attacks/dager/layer1.py)."""
        return self.core.wte.weight, self.core.wpe.weight, self.core.h[0].ln_1

    def token_kv(self, tokens: torch.Tensor, position: int) -> tuple[torch.Tensor, ...]:
        block = self.core.h[0]
        emb = self.core.wte.weight[tokens] + self.core.wpe.weight[position]
        q, k, v = block.attn.c_attn(block.ln_1(emb)).split(emb.shape[-1], dim=-1)
        heads = block.attn.num_heads
        return (emb,) + tuple(t.reshape(len(tokens), heads, -1) for t in (q, k, v))

    def next_layer2_inputs(self, keys, values, step, chunk: int, coarse: bool = False) -> torch.Tensor:
        emb, q, k, v = step
        scale = self._scale(q)
        per = max(1, chunk // max(1, len(emb)))
        out = []
        for s in range(0, len(keys), per):
            kp, vp = keys[s:s + per], values[s:s + per]
            logits = torch.cat([torch.einsum("khd,nphd->nkhp", q, kp),
                                (q * k).sum(-1)[None, :, :, None].expand(len(kp), -1, -1, 1)], -1) * scale
            w = torch.softmax(logits, dim=-1)
            attn = torch.einsum("nkhp,nphd->nkhd", w[..., :-1], vp) + w[..., -1:] * v[None]
            out.append(self._rest(emb[None], attn.flatten(2), coarse))
        return torch.cat(out)

    def pair_layer2_inputs(self, keys, values, step) -> torch.Tensor:
        emb, q, k, v = step
        logits = torch.cat([torch.einsum("mhd,mphd->mhp", q, keys), (q * k).sum(-1)[..., None]], -1) * self._scale(q)
        w = torch.softmax(logits, dim=-1)
        attn = torch.einsum("mhp,mphd->mhd", w[..., :-1], values) + w[..., -1:] * v
        return self._rest(emb, attn.flatten(1))

    def _scale(self, q: torch.Tensor) -> float:
        return q.shape[-1] ** -0.5 if self.core.h[0].attn.scale_attn_weights else 1.0

    def _rest(self, emb: torch.Tensor, attn: torch.Tensor, coarse: bool = False) -> torch.Tensor:
        """Block 0 after attention (output projection, residuals, MLP) and layer 1's ln_1; `coarse` (the
        bfloat16 pre-test) runs GPT-2's tanh GELU as one fused kernel instead of its eight elementwise passes."""
        block = self.core.h[0]
        h = emb + block.attn.c_proj(attn)
        x, mlp = block.ln_2(h), block.mlp
        if coarse and type(mlp.act).__name__ == "NewGELUActivation":
            h = h + mlp.c_proj(torch.nn.functional.gelu(mlp.c_fc(x), approximate="tanh"))
        else:
            h = h + mlp(x)
        return self.core.h[1].ln_1(h)


class BertLayout:
    """BERT: word + token type 0 + position embeddings, LayerNorm; bidirectional (no cached step)."""

    kind, position_free = "encoder", False

    def __init__(self, core: nn.Module):
        self.core = core
        self.embedding = core.embeddings.word_embeddings.weight
        self.projections = [[layer.attention.self.query] for layer in core.encoder.layer]

    def layer1_inputs(self, position: int, rows: slice) -> torch.Tensor:
        emb = self.core.embeddings
        h = emb.word_embeddings.weight[rows] + emb.token_type_embeddings.weight[0] + \
            emb.position_embeddings.weight[position]
        return emb.LayerNorm(h)

    def layer1_parts(self) -> tuple[torch.Tensor, torch.Tensor, nn.Module]:
        emb = self.core.embeddings
        return (emb.word_embeddings.weight + emb.token_type_embeddings.weight[0], emb.position_embeddings.weight,
                emb.LayerNorm)
