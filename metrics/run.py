"""Utility and cost metrics: values the federation measured from real outputs, read off the run record."""
from __future__ import annotations

from metrics.schema import metric, run_value

_RUN = [
    # name, unit, lower_is_better, kind, description, fmt, timing
    ("accuracy", "", False, "utility", "test accuracy of the final global model", "{:.3f}", False),
    ("accuracy_personal", "", False, "utility", "mean test accuracy of the clients' personalized models", "{:.3f}", False),
    ("lm_loss", "nats", True, "utility", "test next-token loss of the final global model", "{:.3f}", False),
    ("perplexity", "", True, "utility", "test perplexity of the final global model", "{:.1f}", False),
    ("epsilon", "", True, "privacy", "user-level DP epsilon at the scenario's delta (Opacus RDP, q = sampled/total clients)", "{:.2f}", False),
    ("noise_multiplier", "", None, "privacy", "DP noise multiplier z: noise std z*clip on the sum of clipped updates", "{:.3f}", False),
    ("clip", "", None, "privacy", "DP per-client L2 clipping norm of the update", "{:.3g}", False),
    ("upload_noise_multiplier", "", None, "privacy", "noise multiplier of one upload as the server sees it (0 = central DP, un-noised)", "{:.3f}", False),
    ("upload_bytes", "B", True, "cost", "bytes one client sends per round (len of what is on the wire)", "{:,.0f}", False),
    ("download_bytes", "B", True, "cost", "bytes one client receives per round", "{:,.0f}", False),
    ("ciphertext_bytes", "B", True, "cost", "serialized ciphertext bytes per client upload", "{:,.0f}", False),
    ("setup_bytes", "B", True, "cost", "bytes exchanged before the first round (keys, negotiation); a CKKS public "
     "context's compressed size varies by tens of bytes with each key generation", "{:,.0f}", True),
    ("wall_s", "s", True, "cost", "wall time of the federated run", "{:.2f}", True),
    ("he_encrypt_s", "s", True, "cost", "client encryption time per upload", "{:.4f}", True),
    ("he_aggregate_s", "s", True, "cost", "server homomorphic aggregation time per round", "{:.4f}", True),
    ("he_decrypt_s", "s", True, "cost", "decryption time per round", "{:.4f}", True),
]

for _name, _unit, _lower, _kind, _desc, _fmt, _timing in _RUN:
    metric(_name, _unit, _lower, _kind, _desc, fmt=_fmt, per_target=False, timing=_timing)(run_value(_name))

# Per-parameter Paillier where it cannot run whole (defenses/sensecrypt/slices.py): measured on a slice of real
# ciphertexts and extrapolated linearly; separate names so they are never read as measured values.
_EXTRAPOLATED = [
    ("he_encrypt_extrapolated_s", "s", "client encryption time per upload, extrapolated from a measured slice", "{:.2f}"),
    ("he_aggregate_extrapolated_s", "s", "server homomorphic aggregation time per round, extrapolated from a measured "
     "slice", "{:.2f}"),
    ("he_decrypt_extrapolated_s", "s", "decryption time per round, extrapolated from a measured slice", "{:.2f}"),
    ("ciphertext_bytes_extrapolated", "B", "ciphertext bytes per client upload, extrapolated from a measured slice",
     "{:,.0f}"),
    ("upload_bytes_extrapolated", "B", "bytes one client sends per round, its ciphertexts extrapolated from a measured "
     "slice", "{:,.0f}"),
    ("round_time_max_extrapolated_s", "s", "modelled round time (round_time_max_s) with the encryption seconds and "
     "bytes extrapolated from a measured slice", "{:.2f}"),
    ("round_time_mean_extrapolated_s", "s", "modelled client time per round (round_time_mean_s) with the encryption "
     "seconds and bytes extrapolated from a measured slice", "{:.2f}"),
]
for _name, _unit, _desc, _fmt in _EXTRAPOLATED:
    metric(_name, _unit, True, "cost", _desc, fmt=_fmt, per_target=False, timing=_unit == "s")(run_value(_name))
metric("encrypted_fraction_extrapolated", "", None, "cost", "fraction of update entries the protocol encrypts where "
       "the wire carries only a measured slice of them (encrypted_fraction is then the slice's)", fmt="{:.3f}",
       per_target=False)(run_value("encrypted_fraction_extrapolated"))

metric("attack_s", "s", None, "cost", "attack wall time per attacked upload", fmt="{:.2f}", per_target=False,
       timing=True, display="attack time", per_attack=True)(run_value("attack_s"))

for _name, _desc in (("encrypted_fraction", "fraction of update entries actually encrypted (after union/consensus)"),
                     ("head_weight_encrypted", "fraction of the classifier head's weight entries encrypted"),
                     ("head_bias_encrypted", "fraction of the classifier head's bias entries encrypted"),
                     ("enc_fraction", "SelectiveShield: fraction of a client's update in the encrypted zone"),
                     ("pers_fraction", "SelectiveShield: fraction kept local in the personalized zone"),
                     ("noise_fraction", "SelectiveShield: fraction in the DP-noised plaintext zone")):
    metric(_name, "", None, "cost", _desc, fmt="{:.3f}", per_target=False)(run_value(_name))

metric("ari", "", False, "utility", "SenseCrypt clustering: adjusted Rand index against the scenario's data categories",
       per_target=False)(run_value("ari"))
metric("silhouette", "", False, "utility", "SenseCrypt clustering: silhouette of the clusters on the sensitivity distances",
       per_target=False)(run_value("silhouette"))
metric("round_time_max_s", "s", True, "cost", "modelled round time: slowest client's protection time (scaled by its CPU "
       "share) plus upload over its bandwidth", per_target=False, timing=True)(run_value("round_time_max_s"))
metric("round_time_mean_s", "s", True, "cost", "modelled client time per round, mean over clients", per_target=False,
       timing=True)(run_value("round_time_mean_s"))
metric("mask_feasible_fraction", "", False, "privacy", "share of client masks meeting the security level and the MI "
       "bound within the budget", per_target=False)(run_value("mask_feasible_fraction"))
metric("accuracy_own_labels", "", False, "utility", "mean over clients of its model's test accuracy on its own label "
       "distribution", per_target=False)(run_value("accuracy_own_labels"))
metric("pruned_fraction", "", None, "cost", "mean fraction of update entries left off the wire per round (DictPFL "
       "encryption-aware pruning)", per_target=False)(run_value("pruned_fraction"))
metric("kde_mi_lora_a", "nats", True, "privacy", "SHE-LoRA Fig. 10: KDE mutual information between the attacked client's "
       "LoRA-A factors and what the server sees of them (encrypted columns as 0)", per_target=False)(
    run_value("kde_mi_lora_a"))
metric("perplexity_true", "", True, "utility", "SHE-LoRA Table 14: perplexity of the base model plus the decrypted "
       "aggregated Delta W", fmt="{:.1f}", per_target=False)(run_value("perplexity_true"))
metric("perplexity_masked", "", None, "privacy", "SHE-LoRA Table 14: perplexity with the encrypted columns of Delta W "
       "zeroed (the server's usable model)", fmt="{:.1f}", per_target=False)(run_value("perplexity_masked"))
metric("cluster_count", "", None, "utility", "SenseCrypt: clusters used for per-cluster FedAvg (after one-client "
       "clusters merge into their nearest)", per_target=False)(run_value("cluster_count"))
metric("single_upload_aggregates", "", True, "privacy", "SenseCrypt: (round, cluster) aggregates of one upload, which "
       "the key server decrypts to that client's own update", per_target=False)(run_value("single_upload_aggregates"))
