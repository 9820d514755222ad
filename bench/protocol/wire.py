"""What really travels between parties, with its real size.

A Payload carries plaintext entries as float32 bytes, ciphertexts as serialized bytes
and public metadata as bytes; `nbytes` is len() of all of it, never a formula. The
layout masks say which entries of which parameter a part holds; they are protocol
knowledge the receiver needs to add the parts up (a defense whose layout changes per
upload must also send it in `meta`, where it is counted).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch


class WireError(ValueError):
    """A message whose declared layout does not match what it carries; names the sending party."""

    def __init__(self, party: str, problem: str):
        super().__init__(f"{party}: {problem}")
        self.party = party
        self.problem = problem


def flat_mask(mask: np.ndarray | torch.Tensor) -> np.ndarray:
    m = mask.detach().cpu().numpy() if isinstance(mask, torch.Tensor) else np.asarray(mask)
    return m.reshape(-1).astype(bool)


@dataclass
class Party:
    """One protocol participant and what it holds."""

    name: str
    keys: dict[str, Any] = field(default_factory=dict)     # scheme -> KeyMaterial
    state: dict[str, Any] = field(default_factory=dict)    # defense state living at this party

    def holds_secret(self) -> bool:
        return any(getattr(k, "secret", None) is not None for k in self.keys.values())

@dataclass(frozen=True)
class PlainPart:
    """Visible entries of one parameter: float32 little-endian bytes in flat order."""

    data: bytes
    shape: tuple[int, ...]
    mask: np.ndarray | None = None  # flat bool layout; None = every entry

    @classmethod
    def of(cls, tensor: torch.Tensor, mask: np.ndarray | None = None) -> "PlainPart":
        flat = tensor.detach().cpu().reshape(-1).to(torch.float32).numpy()
        if mask is not None:
            mask = flat_mask(mask)
            if mask.size != flat.size:
                raise ValueError(f"mask has {mask.size} entries but the parameter has {flat.size}")
            flat = flat[mask]
        return cls(flat.astype("<f4").tobytes(), tuple(tensor.shape), mask)

    def values(self) -> np.ndarray:
        return np.frombuffer(self.data, dtype="<f4")

    def dense(self, fill: float = 0.0) -> torch.Tensor:
        """Full-shape tensor with the visible entries placed and `fill` elsewhere."""
        size = int(np.prod(self.shape)) if self.shape else 1
        out = np.full(size, fill, dtype=np.float32)
        if self.mask is None:
            out[:] = self.values()
        else:
            out[self.mask] = self.values()
        return torch.from_numpy(out).reshape(self.shape)

    def visible(self) -> np.ndarray:
        size = int(np.prod(self.shape)) if self.shape else 1
        return np.ones(size, bool) if self.mask is None else self.mask

    @property
    def nbytes(self) -> int:
        return len(self.data)

    def check(self, party: str, name: str) -> None:
        """WireError naming `party` unless the mask and the byte count fit the declared shape."""
        size = int(np.prod(self.shape)) if self.shape else 1
        if self.mask is not None and (self.mask.ndim != 1 or self.mask.size != size):
            raise WireError(party, f"the mask of '{name}' has {self.mask.size} entries but the parameter "
                                   f"{tuple(self.shape)} has {size}; send a flat mask of {size} entries")
        expected = size if self.mask is None else int(self.mask.sum())
        if len(self.data) != 4 * expected:
            raise WireError(party, f"'{name}' carries {len(self.data)} bytes but its layout declares "
                                   f"{expected} float32 values ({4 * expected} bytes)")


@dataclass(frozen=True)
class CipherPart:
    """Opaque ciphertexts packing the masked entries of several parameters, in layout order."""

    scheme: str
    blobs: tuple[bytes, ...]
    layout: tuple[tuple[str, np.ndarray], ...]  # (parameter name, flat bool mask) in packing order
    length: int                                  # number of packed values

    @property
    def nbytes(self) -> int:
        return sum(len(b) for b in self.blobs)

    def check(self, party: str, shapes: dict[str, tuple[int, ...]] | None = None) -> None:
        """WireError naming `party` unless the layout's masks fit the parameters and add up to `length`."""
        total = 0
        for name, mask in self.layout:
            if shapes is not None:
                if name not in shapes:
                    raise WireError(party, f"the {self.scheme} layout names unknown parameter '{name}'")
                size = int(np.prod(shapes[name])) if shapes[name] else 1
                if np.asarray(mask).size != size:
                    raise WireError(party, f"the {self.scheme} layout's mask of '{name}' has "
                                           f"{np.asarray(mask).size} entries but the parameter has {size}")
            total += int(np.asarray(mask, bool).sum())
        if total != self.length:
            raise WireError(party, f"the {self.scheme} part declares {self.length} values but its layout "
                                   f"selects {total}")


ENTRY_LAYOUTS = ("entries:f4", "entries:bits", "entries:i4")
LAYOUTS = ENTRY_LAYOUTS + ("opaque",)


@dataclass(frozen=True)
class Message:
    """Bytes sent in the clear outside an upload body (negotiation), as sent, and their public layout.

    The layout is protocol knowledge every receiver parses the bytes with (not counted in the
    size): a float32 per entry of the flattened update ("entries:f4"), one bit per entry
    ("entries:bits", numpy packbits), a list of entry indices ("entries:i4"), or "opaque". The
    flattened update is the parameters in the model's update order, each in row-major order.
    """

    data: bytes
    layout: str = "opaque"

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"message layout '{self.layout}' must be one of {', '.join(LAYOUTS)}")

    @property
    def nbytes(self) -> int:
        return len(self.data)


def entry_map(data: bytes, layout: str, size: int) -> np.ndarray | None:
    """A per-entry message decoded to one float per flattened entry (bits and indices: 1 where set);
    None for opaque bytes or bytes that do not fit `size` entries."""
    if layout == "entries:f4" and len(data) == 4 * size:
        return np.frombuffer(data, "<f4").astype(np.float64)
    if layout == "entries:bits" and len(data) == -(-size // 8):
        return np.unpackbits(np.frombuffer(data, np.uint8), count=size).astype(np.float64)
    if layout == "entries:i4" and len(data) % 4 == 0:
        idx = np.frombuffer(data, "<i4")
        if idx.size and (idx.min() < 0 or idx.max() >= size):
            return None
        out = np.zeros(size)
        out[idx] = 1.0
        return out
    return None


@dataclass(frozen=True)
class Payload:
    """One message body: plaintext parts, ciphertext parts, public metadata (with its public layouts)."""

    plain: dict[str, PlainPart] = field(default_factory=dict)
    cipher: tuple[CipherPart, ...] = ()
    meta: dict[str, bytes] = field(default_factory=dict)
    layouts: dict[str, str] = field(default_factory=dict)   # meta key -> Message layout; absent = opaque

    @property
    def plain_bytes(self) -> int:
        return sum(p.nbytes for p in self.plain.values())

    @property
    def cipher_bytes(self) -> int:
        return sum(c.nbytes for c in self.cipher)

    @property
    def nbytes(self) -> int:
        return self.plain_bytes + self.cipher_bytes + sum(len(v) for v in self.meta.values())


@dataclass(frozen=True)
class Upload:
    """A client's upload for one round; `weight` is its public FedAvg share."""

    sender: str
    round: int
    weight: float
    payload: Payload


def dense_payload(update: dict[str, torch.Tensor]) -> Payload:
    """Everything in plaintext: the reference wire format."""
    return Payload(plain={name: PlainPart.of(t) for name, t in update.items()})


class Traffic:
    """Log of every message: (round, sender, receiver, what, bytes), and the content of those sent in the clear."""

    def __init__(self) -> None:
        self.records: list[tuple[int, str, str, str, int]] = []
        self.clear: list[tuple[int, str, str, str, Message]] = []

    def log(self, round: int, sender: str, receiver: str, what: str, nbytes: int,
            content: Message | None = None) -> None:
        self.records.append((round, sender, receiver, what, int(nbytes)))
        if content is not None:
            self.clear.append((round, sender, receiver, what, content))

    def sent_in_clear(self, sender: str, receiver: str) -> list[tuple[int, str, Message]]:
        """(round, what, message) of every clear message `sender` has sent `receiver` so far."""
        return [(r, what, m) for r, s, d, what, m in self.clear if s == sender and d == receiver]

    def per_client(self, direction: str) -> float:
        """Mean bytes one client sends (up) or receives (down) per round it takes part in."""
        key = 1 if direction == "up" else 2
        totals: dict[tuple[int, str], int] = {}
        for rec in self.records:
            if rec[0] >= 0 and rec[key].startswith("client-"):
                totals[(rec[0], rec[key])] = totals.get((rec[0], rec[key]), 0) + rec[4]
        return float(np.mean(list(totals.values()))) if totals else 0.0

    def setup_bytes(self) -> int:
        return sum(r[4] for r in self.records if r[0] < 0)
