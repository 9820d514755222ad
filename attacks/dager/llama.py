"""DAGER on LLaMA-family decoders (transformers' LlamaModel: SmolLM2, LLaMA-2/3): RMSNorm, RoPE, GQA, SwiGLU.

Layer 1: the attention projections read input_layernorm(embed[t]); rotary embeddings act on q
and k after the projection and there is no position table, so a token's layer-1 input is the
same at every position: one pass over the vocabulary gives the candidate set for all positions
(the official code's `has_rope` branch breaks after position 0 the same way).

Gradients read: q_proj, k_proj and v_proj of a layer, rows stacked (d + 2 kv_heads * head_dim
by d; the analogue of GPT-2's fused c_attn). The first query attends only to itself, so its
softmax has no gradient and q_proj's gradient holds no trace of position 0 (in any layer); k
and v do. The official code reads q_proj alone (`layer_ids = range(1, 281, 9)`, index 1 + 9 l =
layers[l].self_attn.q_proj.weight) and relies on LLaMA's tokenizer putting BOS at position 0;
SmolLM2's adds none, and q_proj alone loses every sentence's first token (measured: distance
0.78 to the span at B = 1, where every other token sits at 1e-7). k_proj and v_proj alone
have kv_heads * head_dim rows (192 on SmolLM2), too few for a batch's span; stacked with q_proj
the rows exceed d. With LoRA the factors of one wrapped projection are read: v_proj when it is
a target (values see every position; grad B then has 192 rows, so at most 192 tokens at B = 0),
else k_proj, else q_proj (then the first tokens are lost, as above).

Layer 2, one position at a time (`next_layer2_inputs`): block 0 runs for the new token only,
with q and k rotated at their own positions (the layer's rotary module and apply_rotary_pos_emb,
so its rope type and scaling carry over), keys and values of the prefix cached already rotated,
each key/value head shared by num_key_value_groups query heads (repeat_kv's order), softmax at
the layer's `scaling`, then o_proj, the residual, post_attention_layernorm, the SwiGLU MLP and
layer 1's input_layernorm. It calls the modules, so LoRA wrappers act; the tests check it against
the full forward.

Where this differs from the official code (utils/models.py, filtering_decoder.py, attack.py):
- Padding right with positions 0..L-1 per sentence (our harness); the official LLaMA scripts pad
  left (`--pad left`), start every prefix at the BOS token and score from position 1. SmolLM2's
  tokenizer adds no BOS, so prefixes start at the layer-1 candidates, as for GPT-2; the official
  BOS-only rules (pad/BOS positions always pass, a repeated first token after a BOS is refused)
  have nothing to act on.
- The search runs over cached keys/values instead of a full partial forward per candidate
  (same inputs up to float32 rounding, test-checked); candidates and thresholds are the same.
- q/k/v gradients stacked instead of q_proj's alone (above).
- A prefix of one repeated token is not extended by that token (attacks/dager/search.py), and
  the search stops once no exact prefix is left; the official loop carries fall-backs on.
- Rank: singular values above 10 eps sigma_max of the stacked gradient, max over the first ten
  layers, capped at d - rank_cutoff (556 on SmolLM2); the official default is numpy's
  matrix_rank rule (attacks/dager/span.py says why not).
- The official LoRA path (`range(1, 64, 2)`, the q_proj lora_B gradient of a fine-tuned adapter,
  span thresholds 0.05) reads grad B in r-space; ours follows attacks/dager/arch.py (grad A when
  the global B != 0, else grad B through the known A).
"""
from __future__ import annotations

import importlib

import torch
from torch import nn

from attacks.dager.layouts import is_lora


class LlamaLayout:
    """transformers' LlamaModel: embed_tokens, layers[i].{input_layernorm, self_attn, post_attention_layernorm,
    mlp}, rotary_emb; no position table."""

    kind, position_free = "decoder", True

    def __init__(self, core: nn.Module):
        self.core = core
        self.embedding = core.embed_tokens.weight
        self.projections = [self._read(layer.self_attn) for layer in core.layers]
        attn = core.layers[0].self_attn
        self.rotate = importlib.import_module(type(attn).__module__).apply_rotary_pos_emb

    @staticmethod
    def _read(attn: nn.Module) -> list[nn.Module]:
        wrapped = [m for m in (attn.v_proj, attn.k_proj, attn.q_proj) if is_lora(m)]
        return wrapped[:1] or [attn.q_proj, attn.k_proj, attn.v_proj]

    def layer1_inputs(self, position: int, rows: slice) -> torch.Tensor:
        return self.core.layers[0].input_layernorm(self.core.embed_tokens.weight[rows])

    def token_kv(self, tokens: torch.Tensor, position: int) -> tuple[torch.Tensor, ...]:
        block = self.core.layers[0]
        attn = block.self_attn
        emb = self.core.embed_tokens.weight[tokens]
        x = block.input_layernorm(emb)
        q, k, v = (proj(x).view(len(tokens), -1, attn.head_dim) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
        cos, sin = self.core.rotary_emb(x[None], torch.full((1, 1), position, device=x.device))
        q, k = self.rotate(q, k, cos[0], sin[0], unsqueeze_dim=1)   # cos (1, head) -> (1, 1, head)
        return emb, q, k, v

    def next_layer2_inputs(self, keys, values, step, chunk: int, coarse: bool = False) -> torch.Tensor:
        attn = self.core.layers[0].self_attn
        emb, q, k, v = step
        kc, kv_heads, size = k.shape
        qg = q.view(kc, kv_heads, -1, size)              # query head j * groups + g uses key/value head j
        own = (qg * k[:, :, None]).sum(-1)               # (kc, kv, groups): each candidate attends to itself
        per = max(1, chunk // max(1, kc))
        out = []
        for s in range(0, len(keys), per):
            kp, vp = keys[s:s + per], values[s:s + per]
            n = len(kp)
            logits = torch.cat([torch.einsum("kjgd,npjd->nkjgp", qg, kp),
                                own[None, ..., None].expand(n, -1, -1, -1, 1)], -1) * attn.scaling
            w = torch.softmax(logits, dim=-1)
            mixed = torch.einsum("nkjgp,npjd->nkjgd", w[..., :-1], vp) + w[..., -1:] * v[None, :, :, None]
            out.append(self._rest(emb[None], mixed.reshape(n, kc, -1)))
        return torch.cat(out)

    def pair_layer2_inputs(self, keys, values, step) -> torch.Tensor:
        emb, q, k, v = step
        m, kv_heads, size = k.shape
        qg = q.view(m, kv_heads, -1, size)
        logits = torch.cat([torch.einsum("mjgd,mpjd->mjgp", qg, keys), (qg * k[:, :, None]).sum(-1)[..., None]],
                           -1) * self.core.layers[0].self_attn.scaling
        w = torch.softmax(logits, dim=-1)
        mixed = torch.einsum("mjgp,mpjd->mjgd", w[..., :-1], values) + w[..., -1:] * v[:, :, None]
        return self._rest(emb, mixed.reshape(m, -1))

    def _rest(self, emb: torch.Tensor, mixed: torch.Tensor) -> torch.Tensor:
        """Block 0 after attention (o_proj, residuals, SwiGLU MLP) and layer 1's input_layernorm."""
        block = self.core.layers[0]
        h = emb + block.self_attn.o_proj(mixed)
        h = h + block.mlp(block.post_attention_layernorm(h))
        return self.core.layers[1].input_layernorm(h)
