"""Learning tasks: how a model's loss and utility are computed for a kind of data.

Keeps bench/ free of image assumptions: the engine only calls task.loss and task.evaluate.
"""
from __future__ import annotations

import base64
import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from bench.models import torch_device


def pack_bits(bits) -> str:
    """Per-example 0/1 outcomes as a record stores them (details.per_example.correct): numpy.packbits (big-endian
    bit order) in base64, 1,668 characters for 10,000 examples. Here, with what computes them, so that a change
    of the encoding changes the fingerprint of every cell that stores them (bench/run/version.py)."""
    return base64.b64encode(np.packbits(np.asarray(bits, dtype=bool)).tobytes()).decode("ascii")


def unpack_bits(text: str, n: int) -> np.ndarray:
    """pack_bits' `n` outcomes as a numpy bool array."""
    return np.unpackbits(np.frombuffer(base64.b64decode(text), dtype=np.uint8), count=n).astype(bool)


def trimmed(x: torch.Tensor, pad_id: int | None) -> torch.Tensor:
    """A batch of token sequences without the trailing columns that are padding in every row. Sequences are
    padded to the data set's length (64 tokens for SST-2 phrases of 11 on average); a causal model's outputs at
    the real positions never see later columns and the losses skip padding, so the loss, its gradient and every
    prediction are those of the padded batch, at the cost of the longest sequence in the batch."""
    if pad_id is None or x.dim() != 2 or x.is_floating_point() or not len(x):
        return x
    used = torch.nonzero((x != pad_id).any(0))
    return x[:, :int(used[-1]) + 1] if len(used) else x[:, :1]


class ClassificationTask:
    name = "classification"
    chunk = None   # one backward pass per gradient: batch-norm models' statistics are the whole set's

    def __init__(self, data) -> None:
        self.num_classes = data.num_classes
        self.pad_id = getattr(data, "pad_id", None)   # text classification: sequences are padded

    def loss(self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(model(trimmed(x, self.pad_id)), y)

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
                 per_example: bool = False) -> dict[str, Any]:
        """Accuracy; with `per_example`, also which test examples the model gets right, in test-set order
        (`per_example`: {"correct": base64 bits, "n"}, `pack_bits`), for paired intervals."""
        model.eval()
        dev = torch_device.model_device(model)
        hits = [model(trimmed(xb, self.pad_id).to(dev)).argmax(1).cpu() == yb for xb, yb in zip(x.split(512), y.split(512))]
        model.train()
        out: dict[str, Any] = {"accuracy": sum(int(h.sum()) for h in hits) / max(len(y), 1)}
        if per_example:
            correct = torch.cat(hits).numpy() if hits else np.zeros(0, bool)
            out["per_example"] = {"correct": pack_bits(correct), "n": len(correct)}
        return out


class CausalLMTask:
    """Next-token prediction; padding positions are ignored in the loss."""

    name = "causal-lm"
    chunk = 32     # sequences per backward pass of a large set's gradient (bench/federation/state.py)

    def __init__(self, data) -> None:
        self.pad_id = data.pad_id

    def _scored(self, model, x) -> tuple[torch.Tensor, torch.Tensor]:
        """(next-token logits, their targets with padding as -100)."""
        x = trimmed(x, self.pad_id)
        logits = model(x)[:, :-1]
        target = x[:, 1:].clone()
        target[target == self.pad_id] = -100
        return logits, target

    def _token_losses(self, model, x):
        logits, target = self._scored(model, x)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=-100,
                               reduction="sum"), int((target != -100).sum())

    def loss(self, model, x, y=None):
        total, count = self._token_losses(model, x)
        return total / max(count, 1)

    def loss_sum(self, model, x, y=None) -> tuple[torch.Tensor, int]:
        """(summed token loss, counted tokens): a large set's loss is the sum over its chunks divided by all
        their tokens."""
        return self._token_losses(model, x)

    @torch.no_grad()
    def evaluate(self, model, x, y=None, per_example: bool = False) -> dict[str, Any]:
        """Test loss and perplexity; with `per_example`, each test sequence's summed token loss (nats, 6
        significant digits) and counted tokens, in test-set order, for paired intervals."""
        model.eval()
        total, count, nll, tokens = 0.0, 0, [], []
        for xb in x.split(64):
            logits, target = self._scored(model, xb.to(torch_device.model_device(model)))
            flat_logits, flat_target = logits.reshape(-1, logits.shape[-1]), target.reshape(-1)
            t = F.cross_entropy(flat_logits, flat_target, ignore_index=-100, reduction="sum")
            total, count = total + float(t), count + int((target != -100).sum())
            if per_example:
                each = F.cross_entropy(flat_logits, flat_target, ignore_index=-100, reduction="none")
                nll += [float(f"{v:.6g}") for v in each.reshape(target.shape).sum(1).tolist()]
                tokens += (target != -100).sum(1).tolist()
        model.train()
        loss = total / max(count, 1)
        out: dict[str, Any] = {"lm_loss": loss, "perplexity": math.exp(min(loss, 50.0))}
        if per_example:
            out["per_example"] = {"nll": nll, "tokens": tokens}
        return out


TASKS = {ClassificationTask.name: ClassificationTask, CausalLMTask.name: CausalLMTask}
