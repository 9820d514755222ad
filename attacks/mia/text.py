"""Membership attacks on causal LMs (the seven of SHE-LoRA appendix F.4 / MIMIR), one shared forward pass.

Notation (anchors A1): lp_t = log p(x_t | x_<t) over the non-padding tokens, LL = mean lp_t,
NLL = -LL. Every score is converted to "higher = member"; native signs and sources:
- mia-loss (in image.py): LL (MIMIR's LOSS is NLL, lower = member).
- mia-zlib: MIMIR scores NLL / zlib bytes of the text, lower = member; score = LL / zlib bytes.
- mia-lowercase (Carlini et al. 2021, detect-pretrain): NLL(x) / NLL(lower(x)), lower = member;
  score = NLL(lower(x)) / NLL(x). The lowercased text is re-tokenized at the scenario's length.
- mia-mink (Shi et al., k a parameter): mean of the lowest max(1, floor(k T)) lp_t, higher = member
  (MIMIR negates it; the max(1, .) replaces MIMIR's NaN for very short texts).
- mia-minkpp (Zhang et al., k): z_t = (lp_t - mu_t) / sigma_t with mu_t, sigma_t the mean and std
  of log p under the full next-token distribution; mean of the lowest k fraction, higher = member.
- mia-recall (Xie et al. 2024): LL(x | P) / LL(x), where P is `shots` auxiliary (non-member) texts,
  disjoint from every candidate, and only x's tokens are scored. The paper's finding is that a
  non-member prefix lowers a member's likelihood more, so the ratio is higher for members; used
  as is. The prefix is cut so prefix + x fit the model's context.
- mia-ref (Carlini et al. 2021; MIMIR's ref): NLL_target(x) - NLL_ref(x), lower = member; score =
  LL_target - LL_ref. The reference is the model the server sent in round one (the membership
  knowledge's initial model): for a fine-tune of a pretrained LM that is the pretrained model
  itself, which has seen no member, the natural reference (MIMIR picks other pretrained LMs).
- mia-pac (Ye et al., PAC): PD(s) = mean(top 5% lp) - mean(bottom 30% lp); PAC = PD(x) - mean over
  `augmentations` EDA variants of PD; the official code takes the AUC of -PAC, so score = -PAC. The
  EDA variants use random swap and random deletion at alpha = 0.3, seeded; synonym replacement and
  insertion need WordNet, which is not available offline.
"""
from __future__ import annotations

import hashlib
import random
import zlib
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from attacks.mia.common import ModelMIA
from bench.protocol.view import Knowledge, load
from bench.registry import ATTACKS


@dataclass
class TokenStats:
    lp: torch.Tensor       # (B, T-1) log-prob of each next token
    mask: torch.Tensor     # (B, T-1) True on real tokens
    mu: torch.Tensor       # (B, T-1) E_v[log p(v)]
    sigma: torch.Tensor    # (B, T-1) std_v[log p(v)]

    def mean_ll(self) -> np.ndarray:
        m = self.mask.double()
        return ((self.lp.double() * m).sum(1) / m.sum(1).clamp(min=1)).numpy()


_SHARED: list = []   # (model entries id, ids, stats) of the last few forwards: one pass serves every attack


@torch.no_grad()
def token_stats(model: torch.nn.Module, ids: torch.Tensor, knowledge: Knowledge, batch: int = 32) -> TokenStats:
    """Per-token statistics. Rows run in batches of similar length, cut after their last real token: the
    model is causal and pads are right, so the cut changes no statistic of a real token (only the cost)."""
    pad = knowledge.tokenizer.pad_token_id
    real = ids != pad
    length = torch.where(real.any(1), real.shape[1] - real.flip(1).int().argmax(1), 0)
    order = torch.argsort(length, stable=True)
    width = ids.shape[1] - 1
    out = []
    for rows in order.split(batch):
        xb = ids[rows][:, :max(2, int(length[rows].max()))]
        logp = torch.log_softmax(model(xb)[:, :-1].float(), -1)
        target = xb[:, 1:]
        lp = logp.gather(-1, target.unsqueeze(-1)).squeeze(-1)
        p = logp.exp()
        mu = (p * logp).sum(-1)
        sigma = ((p * logp.pow(2)).sum(-1) - mu.pow(2)).clamp(min=1e-12).sqrt()
        cut = width - lp.shape[1]
        out.append((F.pad(lp, (0, cut)), F.pad((target != pad).int(), (0, cut)).bool(), F.pad(mu, (0, cut)),
                    F.pad(sigma, (0, cut), value=1.0)))
    back = torch.argsort(order)
    return TokenStats(*(torch.cat(t)[back] for t in zip(*out)))


def shared_stats(attack: ModelMIA, knowledge: Knowledge) -> TokenStats:
    """Candidates' token statistics on the assembled model, computed once per (run, fill)."""
    mk = knowledge.membership
    for owner, fill, stats in _SHARED:
        if owner is mk and fill == attack.fill:
            return stats
    stats = token_stats(attack.target_model(knowledge), mk.candidates_x, knowledge)
    _SHARED[:] = _SHARED[-3:] + [(mk, attack.fill, stats)]
    return stats


def texts_of(ids: torch.Tensor, tokenizer) -> list[str]:
    pad = tokenizer.pad_token_id
    return [tokenizer.decode([int(t) for t in row if int(t) != pad], skip_special_tokens=True) for row in ids]


def encode(tokenizer, texts: list[str], length: int) -> torch.Tensor:
    enc = tokenizer(texts, truncation=True, max_length=length, padding="max_length")["input_ids"]
    return torch.tensor(np.asarray(enc, dtype=np.int64))


class LMMIA(ModelMIA):
    tasks = ("causal-lm",)


@ATTACKS.register("mia-zlib", "zlib membership attack: log-likelihood over zlib-compressed bytes")
class MIAZlib(LMMIA):
    links = {"paper": "https://arxiv.org/abs/2012.07805", "code": "https://github.com/iamgroot42/mimir"}

    def score(self, knowledge, seed):
        stats = shared_stats(self, knowledge)
        sizes = np.array([len(zlib.compress(t.encode("utf-8")))
                          for t in texts_of(knowledge.membership.candidates_x, knowledge.tokenizer)])
        return stats.mean_ll() / np.maximum(sizes, 1), {}


@ATTACKS.register("mia-lowercase", "lowercase membership attack: NLL(lowercased) / NLL(original)")
class MIALowercase(LMMIA):
    links = {"paper": "https://arxiv.org/abs/2012.07805", "code": "https://github.com/iamgroot42/mimir"}

    def score(self, knowledge, seed):
        mk = knowledge.membership
        stats = shared_stats(self, knowledge)
        lower = encode(knowledge.tokenizer, [t.lower() for t in texts_of(mk.candidates_x, knowledge.tokenizer)],
                       mk.candidates_x.shape[1])
        low = token_stats(self.target_model(knowledge), lower, knowledge)
        return -low.mean_ll() / np.maximum(-stats.mean_ll(), 1e-12), {}


def lowest_k_mean(values: torch.Tensor, mask: torch.Tensor, k: float) -> np.ndarray:
    out = np.empty(len(values))
    for i, (v, m) in enumerate(zip(values, mask)):
        real = v[m].double()
        if real.numel() == 0:
            out[i] = np.nan
            continue
        count = max(1, int(np.floor(k * real.numel())))
        out[i] = float(torch.sort(real).values[:count].mean())
    return out


@ATTACKS.register("mia-mink", "Min-K% membership attack: mean of the lowest k token log-probs")
class MIAMinK(LMMIA):
    links = {"paper": "https://arxiv.org/abs/2310.16789", "code": "https://github.com/swj0419/detect-pretrain-code"}

    def __init__(self, k: float = 0.2, fill: str = "last") -> None:
        if not 0 < k <= 1:
            raise ValueError(f"k must be in (0, 1], got {k}")
        super().__init__(fill=fill, k=k)
        self.k = k

    def score(self, knowledge, seed):
        stats = shared_stats(self, knowledge)
        return lowest_k_mean(stats.lp, stats.mask, self.k), {"k": self.k}


@ATTACKS.register("mia-minkpp", "Min-K%++ membership attack: lowest k of the calibrated token z-scores")
class MIAMinKPP(MIAMinK):
    links = {"paper": "https://arxiv.org/abs/2404.02936", "code": "https://github.com/zjysteven/mink-plus-plus"}

    def score(self, knowledge, seed):
        stats = shared_stats(self, knowledge)
        return lowest_k_mean((stats.lp - stats.mu) / stats.sigma, stats.mask, self.k), {"k": self.k}


@ATTACKS.register("mia-recall", "ReCaLL membership attack: LL(x | non-member prefix) / LL(x)")
class MIARecall(LMMIA):
    links = {"paper": "https://arxiv.org/abs/2406.15968", "code": "https://github.com/ruoyuxie/recall"}

    def __init__(self, shots: int = 3, fill: str = "last") -> None:
        if shots < 1:
            raise ValueError("shots must be >= 1")
        super().__init__(fill=fill, shots=shots)
        self.shots = shots

    def aux_needed(self) -> int:
        return self.shots   # non-member texts for the prefix

    def score(self, knowledge, seed):
        mk = knowledge.membership
        pad = knowledge.tokenizer.pad_token_id
        model = self.target_model(knowledge)
        context = int(getattr(getattr(model, "lm", model).config, "n_positions", 1024))
        room = context - mk.candidates_x.shape[1]
        prefix = torch.cat([row[row != pad] for row in mk.aux_x[:self.shots]])[-room:]
        stats = shared_stats(self, knowledge)
        ids = torch.cat([prefix.expand(len(mk.candidates_x), -1), mk.candidates_x], 1)
        cond = token_stats(model, ids, knowledge)
        n = len(prefix)
        # the tokens LL(x) scores: x's second token onward, i.e. predictions from position n on
        lp, mask = cond.lp[:, n:], cond.mask[:, n:]
        ll_cond = ((lp.double() * mask).sum(1) / mask.sum(1).clamp(min=1)).numpy()
        return ll_cond / np.minimum(stats.mean_ll(), -1e-12), {"shots": self.shots, "prefix_tokens": n}


_REFERENCE: list = []   # (key, stats): the reference model's statistics, shared by every defense of a scenario


def _fingerprint(knowledge: Knowledge) -> str:
    mk = knowledge.membership
    h = hashlib.sha256(repr((knowledge.model_name, sorted(knowledge.model_params.items()))).encode())
    for name in sorted(mk.initial):
        h.update(name.encode() + mk.initial[name].detach().cpu().numpy().tobytes())
    h.update(mk.candidates_x.numpy().tobytes())
    return h.hexdigest()


@ATTACKS.register("mia-ref", "reference membership attack: LL(target) - LL(reference), the reference being "
                             "the initial model the server sent (the pretrained base of a fine-tune)")
class MIARef(LMMIA):
    links = {"paper": "https://arxiv.org/abs/2012.07805", "code": "https://github.com/iamgroot42/mimir"}

    def score(self, knowledge, seed):
        stats = shared_stats(self, knowledge)
        key = _fingerprint(knowledge)
        ref = next((s for k, s in _REFERENCE if k == key), None)
        if ref is None:
            ref = token_stats(load(knowledge, knowledge.membership.initial), knowledge.membership.candidates_x,
                              knowledge)
            _REFERENCE[:] = _REFERENCE[-1:] + [(key, ref)]
        return stats.mean_ll() - ref.mean_ll(), {"reference": "the initial global model"}


def eda(words: list[str], alpha: float, rng: random.Random) -> list[str]:
    """EDA random swap then random deletion (Wei & Zou 2019), each at rate alpha."""
    words = list(words)
    for _ in range(max(1, int(alpha * len(words)))):
        if len(words) > 1:
            i, j = rng.randrange(len(words)), rng.randrange(len(words))
            words[i], words[j] = words[j], words[i]
    kept = [w for w in words if rng.random() > alpha]
    return kept or [rng.choice(words)] if words else words


def polarized_distance(lp: torch.Tensor, mask: torch.Tensor, top: float = 0.05, bottom: float = 0.3) -> np.ndarray:
    out = np.empty(len(lp))
    for i, (v, m) in enumerate(zip(lp, mask)):
        real = torch.sort(v[m].double(), descending=True).values
        if real.numel() == 0:
            out[i] = np.nan
            continue
        hi = max(1, int(np.ceil(top * real.numel())))
        lo = max(1, int(np.ceil(bottom * real.numel())))
        out[i] = float(real[:hi].mean() - real[-lo:].mean())
    return out


@ATTACKS.register("mia-pac", "PAC membership attack: polarized distance vs seeded EDA augmentations")
class MIAPAC(LMMIA):
    links = {"paper": "https://arxiv.org/abs/2405.11930", "code": "https://github.com/yyy01/PAC"}

    def __init__(self, augmentations: int = 5, alpha: float = 0.3, fill: str = "last") -> None:
        if augmentations < 1 or not 0 < alpha < 1:
            raise ValueError("augmentations >= 1 and alpha in (0, 1) are required")
        super().__init__(fill=fill, augmentations=augmentations, alpha=alpha)
        self.augmentations, self.alpha = augmentations, alpha

    def score(self, knowledge, seed):
        mk = knowledge.membership
        stats = shared_stats(self, knowledge)
        model = self.target_model(knowledge)
        texts = texts_of(mk.candidates_x, knowledge.tokenizer)
        rng = random.Random(seed)
        augmented = []
        for _ in range(self.augmentations):
            variants = [" ".join(eda(t.split(), self.alpha, rng)) for t in texts]
            s = token_stats(model, encode(knowledge.tokenizer, variants, mk.candidates_x.shape[1]), knowledge)
            augmented.append(polarized_distance(s.lp, s.mask))
        pac = polarized_distance(stats.lp, stats.mask) - np.mean(augmented, axis=0)
        return -pac, {"augmentations": self.augmentations, "alpha": self.alpha}
