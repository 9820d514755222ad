"""Outcomes that are neither a number nor an error: diverged training, blocked by design, and what
is left to the suite's load (a configuration gap is refused there, never recorded as a verdict)."""
from __future__ import annotations

import ast
import json
from pathlib import Path

import torch

from bench.cli import main
from bench.protocol.defense import Defense
from bench.registry import DEFENSES
from bench.run.runner import run_suite
from bench.run.store import Store
from tests.conftest import tiny_suite

ROOT = Path(__file__).resolve().parents[1]

# Every reason an attack may give for "blocked by design", and why it is the defense's doing (its view
# or protocol), never the scenario's. A new reason fails the test until it is audited here.
VIEW_REASONS = {
    "the server view is empty: every entry is encrypted or kept local": "the view",
    "the server does not know the current global weights (clients decrypt them)": "the key topology",
    "grad A needs the A the client started from, and its clients draw A and never send it":
        "an initialization the clients draw and never send",
    "no column of A on the projections DAGER reads is known to the server (drawn by the client and encrypted in "
    "the upload)": "an initialization the clients draw, and the view",
    "the defense's model does not train the first two layers' projections, so their gradients are not sent":
        "the defense's reparameterized model (adapt_model)",
    "the first two layers' projection gradients are entirely hidden from the server": "the view",
    "needs the server's copy of the classifier head, but the global head weights are not known to it":
        "the key topology",
    "no trainable parameter has a visible entry (only buffers are seen)": "the view",
    "the server sees no entry of the attacked upload": "the view",
    "nothing per-entry was sent in the clear (no sensitivity vector, mask or proposal in the view)":
        "the protocol's negotiation traffic",
    "the classifier head is entirely hidden from the server": "the view",
    "the server knows no entry of the final model (every entry is encrypted or kept local)": "the view",
    "the labels are neither granted nor readable from the classifier head (hidden); dlg and inverting-gradients "
    "optimize them": "the view (a hidden head)",
    "the iDLG label rule needs a visible entry in every row of the classifier head": "the view (a hidden head)",
    "the label counts need every entry of the classifier head's weight update (hidden here)": "the view (a hidden head)",
    "every entry the canary moves is hidden from the server": "the view",
    "no row of the block has its bias gradient and its whole weight-gradient row in the clear": "the view",
    "no row of the block has its bias gradient and a weight-gradient entry in the clear": "the view",
    "every entry the canaries move is hidden from the server": "the view",
    "{}, and layer 0's inputs pass through weights it does not know": "the key topology (clients decrypt the weights)",
    ", and layer 0's inputs pass through weights it does not know": "the key topology (clients decrypt the weights)",
    "grad B = (B_start - B_upload) / lr needs the B the client started from, which its clients rebuild from the "
    "decrypted aggregate; the server knows it only up to its column space{}":
        "an initialization the clients rebuild from an aggregate the server cannot decrypt",
    "grad B = (B_start - B_upload) / lr needs the B the client started from, which its clients rebuild from the "
    "decrypted aggregate; the server knows it only up to its column space":
        "an initialization the clients rebuild from an aggregate the server cannot decrypt",
    "every column of A on layer 0's projection is hidden from the server": "the view",
    "the start A's row space, as the server's sum gives it, fills every column it sees in clear":
        "the view and the protocol's initialization (what is in clear lies in the server's own sum)",
    "the server does not know the global weights of layer '{}' (clients decrypt them)": "the key topology",
    "the server does not know the global weights of layer '": "the key topology",
    "' (clients decrypt them)": "the key topology",
}
# Reasons a run-time helper can still return but that the suite's load refuses first (Attack.applicable).
REFUSED_AT_LOAD = {"label_strategy 'known' needs a scenario that grants the attacker the labels"}


def _returned_strings(functions=("blocked", "labels_from", "label_source"), suffix="_blocked") -> dict[str, str]:
    """Every string a blocking function of attacks/ or bench/ returns (f-strings with {} for the holes)."""
    found: dict[str, str] = {}
    for path in sorted(ROOT.glob("attacks/**/*.py")) + sorted(ROOT.glob("bench/**/*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.FunctionDef) and (node.name in functions or node.name.endswith(suffix))):
                continue
            for ret in (n for n in ast.walk(node) if isinstance(n, ast.Return) and n.value is not None):
                for c in ast.walk(ret.value):
                    if isinstance(c, ast.JoinedStr):
                        text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in c.values)
                    elif isinstance(c, ast.Constant) and isinstance(c.value, str) and len(c.value) > 12:
                        text = c.value
                    else:
                        continue
                    found[text] = f"{path.relative_to(ROOT)}:{node.name}"
    return found


def test_every_blocked_reason_is_the_defenses_doing():
    found = _returned_strings()
    unaudited = {r: where for r, where in found.items() if r not in VIEW_REASONS and r not in REFUSED_AT_LOAD}
    assert not unaudited, f"audit these blocked reasons (view/protocol, or move them to applicable()): {unaudited}"
    assert set(VIEW_REASONS) <= set(found), f"stale entries: {set(VIEW_REASONS) - set(found)}"


def _huge_lr_suite(tmp_path: Path) -> Path:
    path = tmp_path / "diverge.toml"
    path.write_text("""
name = "diverge"
[[scenarios]]
name = "huge-lr"
dataset = "digits"
model = "mlp"
num_clients = 2
clients_per_round = 2
rounds = 2
local_epochs = 2
lr = 1e30
max_train = 120
max_test = 60
attack_batch_size = 2
[[defenses]]
name = "plaintext"
[[attacks]]
name = "ilrg"
[[attacks]]
name = "mia-loss"
""")
    return path


def test_a_diverged_training_is_an_outcome_with_its_round_and_utility(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", str(_huge_lr_suite(tmp_path)), "--out", str(out)]) == 0
    assert "2 diverged, 0 failed" in capsys.readouterr().out
    records = json.loads((out / "results.json").read_text())
    assert {r["attack"] for r in records} == {"ilrg", "mia-loss"}
    for rec in records:
        assert rec["status"] == "diverged", rec
        assert rec["reason"].startswith("training diverged at round 0: client-1's training loss is not finite")
        assert rec["metrics"]["diverged_round"] == 0
        assert 0.0 <= rec["metrics"]["accuracy"] <= 1.0     # the last finite global model: the initial one
    page = (out / "index.html").read_text()
    assert page.count('class="diverged') >= 2 and "training diverged at round 0" in page
    store = Store(out / "leakbench.sqlite")
    assert all(store.finished(r["cell_id"]) for r in records)   # an outcome: a rerun keeps it
    store.close()


class _NaNAfter(Defense):
    """Plaintext whose decoded aggregate turns NaN in round 1: the global model's divergence."""

    def decode(self, fed, aggregate, party):
        update = super().decode(fed, aggregate, party)
        return {n: v * torch.nan for n, v in update.items()} if fed.round == 1 else update


def test_a_divergence_after_round_zero_keeps_the_last_finite_model(tmp_path):
    DEFENSES.add("nan-after-round-0", _NaNAfter, "test defense")
    try:
        late = run_suite(tiny_suite(["nan-after-round-0"], ["ilrg"], rounds=3), tmp_path / "late")
        short = run_suite(tiny_suite(["plaintext"], ["ilrg"], rounds=1), tmp_path / "short")
    finally:
        DEFENSES._entries.pop("nan-after-round-0")
    assert late.diverged == 1 and late.failed == 0 and short.ok == 1
    rec = Store(tmp_path / "late" / "leakbench.sqlite").records()[0]
    ref = Store(tmp_path / "short" / "leakbench.sqlite").records()[0]
    assert rec["reason"] == "training diverged at round 1: the new global model is not finite (NaN or inf)"
    assert rec["metrics"]["diverged_round"] == 1
    assert rec["metrics"]["accuracy"] == ref["metrics"]["accuracy"]   # the model after round 0


def test_a_membership_attack_without_mia_size_gets_the_default_pool(tmp_path):
    from bench.federation.candidates import DEFAULT_SIZE

    summary = run_suite(tiny_suite(["plaintext"], ["mia-loss"], max_test=80, mia_aux=20), tmp_path)
    assert summary.ok == 1, summary.failures
    rec = Store(tmp_path / "leakbench.sqlite").records()[0]
    labels = rec["details"]["labels"]
    assert len(labels) == 2 * min(DEFAULT_SIZE, 80 - 20) and sum(labels) == len(labels) // 2


def test_an_update_beyond_the_encodings_range_is_a_divergence_not_a_failure(monkeypatch):
    """A blown-up update that CKKS cannot encode stops the run as diverged at that round, with the reason."""
    import bench.crypto.params as params
    import defenses.selective as selective
    from bench.data.loading import load_dataset
    from bench.federation.engine import run_federation
    from bench.federation.scenario import Scenario

    def blown_up(self, fed, client, update, weight):
        raise params.OutOfRange(client.name, "value magnitude 433670 exceeds 131072, the largest this key's "
                                             "encoding can hold")

    monkeypatch.setattr(selective.FedHEFull, "encode", blown_up)
    sc = Scenario(name="s", dataset="digits", model="mlp", num_clients=2, clients_per_round=2, rounds=2)
    run = run_federation(sc, load_dataset("digits", None, seed=0, seq_len=32), DEFENSES.get("fedhe-full")())
    assert run.diverged and "round 0" in run.diverged and "left the range its encryption can encode" in run.diverged
    assert run.metrics["diverged_round"] == 0 and "accuracy" in run.metrics
