"""SHE-LoRA's CKKS: column blocks of A on the wire, B_i * A_i^cipher computed by the server under HE.

Parameters are the paper's for the 3B model (N = 8192, [60, 40, 60]) at scale 2^40 (the
authors' 2^24 loses precision, anchors 1.7: max error 1.6e-3). A block holds `chunk` columns,
each column's r_i entries contiguous. The server multiplies a block by the plaintext
block-diagonal matrix diag(w_i B_i^T, ...) (TenSEAL's vector-matrix product, one rescale), so
the result holds w_i * (B_i A_i)[:, j] for the block's columns, m slots each, and adds these
over clients. That product rotates, so the aggregation server's public context carries galois
keys (about 18 MB, counted in setup bytes); it never carries the secret key, unlike the
authors' code, which loads the full context at the server. Clients hold the secret (shared key).
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import tenseal as ts

from bench.crypto.params import KeyMaterial

PARAMS = {"name": "ckks-n8192-60.40.60-s40-galois", "poly_modulus_degree": 8192,
          "coeff_mod_bit_sizes": [60, 40, 60], "scale_bits": 40}


def keygen() -> KeyMaterial:
    ctx = ts.context(ts.SCHEME_TYPE.CKKS, PARAMS["poly_modulus_degree"],
                     coeff_mod_bit_sizes=PARAMS["coeff_mod_bit_sizes"])
    ctx.global_scale = 2.0 ** PARAMS["scale_bits"]
    ctx.generate_galois_keys()
    public = ctx.serialize(save_secret_key=False, save_galois_keys=True, save_relin_keys=False)
    secret = ctx.serialize(save_secret_key=True, save_galois_keys=False, save_relin_keys=False)
    return KeyMaterial("ckks", public, secret, dict(PARAMS))


@lru_cache(maxsize=8)
def context(blob: bytes) -> ts.Context:
    return ts.context_from(blob)


def slots() -> int:
    return PARAMS["poly_modulus_degree"] // 2


def encrypt_blocks(km: KeyMaterial, a_cols: np.ndarray, chunk: int) -> list[bytes]:
    """a_cols: r x k (the client's columns in negotiated order); one ciphertext per `chunk` columns."""
    ctx = context(km.secret)
    return [ts.ckks_vector(ctx, a_cols[:, s:s + chunk].T.reshape(-1).tolist()).serialize()
            for s in range(0, a_cols.shape[1], chunk)]


class BlockAggregator:
    """Server: sum over clients of w_i B_i A_i^cipher, block by block, on the public context."""

    def __init__(self, km: KeyMaterial, m: int, chunk: int):
        self.ctx = context(km.public)
        if self.ctx.is_private():
            raise RuntimeError("aggregation server: the public context carries a secret key; refusing to aggregate")
        if chunk * m > slots():
            raise ValueError(f"a block's product needs chunk * m = {chunk * m} slots, more than {slots()}; "
                             f"lower chunk")
        self.m, self.chunk = m, chunk
        self.sums: dict[int, ts.CKKSVector] = {}

    def add(self, blobs: list[bytes], b: np.ndarray, weight: float, k: int) -> None:
        r = b.shape[1]
        for idx, blob in enumerate(blobs):
            cols = min(self.chunk, k - idx * self.chunk)
            matrix = np.zeros((r * cols, self.chunk * self.m))
            for c in range(cols):
                matrix[c * r:(c + 1) * r, c * self.m:(c + 1) * self.m] = weight * b.T
            product = ts.ckks_vector_from(self.ctx, blob).mm(matrix.tolist())
            self.sums[idx] = product if idx not in self.sums else self.sums[idx] + product

    def blobs(self) -> list[bytes]:
        return [self.sums[i].serialize() for i in sorted(self.sums)]


def decrypt_blocks(km: KeyMaterial, blobs: list[bytes], m: int, k: int, chunk: int) -> np.ndarray:
    """m x k aggregated columns (negotiated order) from the summed block products."""
    ctx = context(km.secret)
    out = np.zeros((m, k))
    for idx, blob in enumerate(blobs):
        values = np.asarray(ts.ckks_vector_from(ctx, blob).decrypt())
        cols = min(chunk, k - idx * chunk)
        out[:, idx * chunk: idx * chunk + cols] = values[:cols * m].reshape(cols, m).T
    return out
