"""Utility and cost metrics: values the federation measured from real outputs, read off the run record."""
from __future__ import annotations

from bench.protocol.evidence import metric, run_value

_RUN = [
    # name, unit, lower_is_better, kind, description, fmt, timing
    ("accuracy", "", False, "utility", "test accuracy of the final global model", "{:.3f}", False),
    ("accuracy_personal", "", False, "utility", "mean test accuracy of the clients' personalized models", "{:.3f}", False),
    ("test_samples", "", None, "utility", "test samples the accuracy was measured on", "{:.0f}", False),
    ("chance_accuracy", "", None, "utility", "accuracy of a uniform guess (1 / classes)", "{:.3f}", False),
    ("lm_loss", "nats", True, "utility", "test next-token loss of the final global model", "{:.3f}", False),
    ("perplexity", "", True, "utility", "test perplexity of the final global model", "{:.1f}", False),
    ("epsilon", "", True, "privacy", "DP epsilon at its delta from the defense's accountant; what it covers (user- or record-level, which release) is in details.dp", "{:.2f}", False),
    ("noise_multiplier", "", None, "privacy", "DP noise multiplier z: noise std z*clip on a sum of clipped contributions (client updates, or examples under record-level DP)", "{:.3f}", False),
    ("clip", "", None, "privacy", "DP L2 clipping norm of one contribution (a client's update, or one example's gradient under record-level DP)", "{:.3g}", False),
    ("upload_noise_multiplier", "", None, "privacy", "noise multiplier of one upload as the server sees it (0 = central DP, un-noised)", "{:.3f}", False),
    ("diverged_round", "", None, "utility", "round at which training became non-finite (update, loss or model) and the "
     "run stopped; its utility columns are the last finite global model's", "{:.0f}", False),
    ("upload_bytes", "B", True, "cost", "bytes one client sends per round (len of what is on the wire)", "{:,.0f}", False),
    ("download_bytes", "B", True, "cost", "bytes one client receives per round", "{:,.0f}", False),
    ("ciphertext_bytes", "B", True, "cost", "serialized ciphertext bytes per client upload", "{:,.0f}", False),
    ("setup_bytes", "B", True, "cost", "bytes exchanged before the first round (keys, negotiation); a CKKS public "
     "context's compressed size varies by tens of bytes with each key generation", "{:,.0f}", True),
    ("wall_s", "s", True, "cost", "wall time of the federated run", "{:.2f}", True),
    ("he_encrypt_s", "s", True, "cost", "client encryption time per upload, CPU seconds (the process and its HE "
     "workers: other processes on the machine do not move it)", "{:.4f}", True),
    ("he_aggregate_s", "s", True, "cost", "server homomorphic aggregation time per round, CPU seconds", "{:.4f}", True),
    ("he_decrypt_s", "s", True, "cost", "decryption time per round, CPU seconds", "{:.4f}", True),
    ("he_encrypt_wall_s", "s", True, "cost", "client encryption time per upload, wall seconds (moves with the "
     "machine's load)", "{:.4f}", True),
    ("he_aggregate_wall_s", "s", True, "cost", "server homomorphic aggregation time per round, wall seconds",
     "{:.4f}", True),
    ("he_decrypt_wall_s", "s", True, "cost", "decryption time per round, wall seconds", "{:.4f}", True),
]

for _name, _unit, _lower, _kind, _desc, _fmt, _timing in _RUN:
    metric(_name, _unit, _lower, _kind, _desc, fmt=_fmt, per_target=False, timing=_timing)(run_value(_name))

metric("attack_s", "s", None, "cost", "attack wall time per attacked upload", fmt="{:.2f}", per_target=False,
       timing=True, display="attack time", per_attack=True)(run_value("attack_s"))

for _name, _desc in (("encrypted_fraction", "fraction of update entries actually encrypted (after union/consensus)"),
                     ("head_weight_encrypted", "fraction of the classifier head's weight entries encrypted"),
                     ("head_bias_encrypted", "fraction of the classifier head's bias entries encrypted")):
    metric(_name, "", None, "cost", _desc, fmt="{:.3f}", per_target=False)(run_value(_name))
