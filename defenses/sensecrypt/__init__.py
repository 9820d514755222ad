"""SenseCrypt (Li, Yan, Han, Liu, Yu, arXiv 2508.04100), implemented from the paper; no public code exists.

Modules: clustering (eq. 2 sensitivity, Algorithm 2 DP, AP, ARI/silhouette), profiles (device
profiles of section 4.1, budgets of section 3.2, the round-time model), selection (eqs. 4-9),
percluster (per-cluster FedAvg over heterogeneous masks), protocol (the defense, Algorithm 3),
baselines (paillier-full, maskcrypt-paillier), evaluation (own-label accuracy), tiny_model.

Interpretations where the paper leaves a choice open, each stated where it is coded:
- Topology: the dual-server variant (appendix I, Algorithm 3): a key server (DKMS) holds the
  only secret key and decrypts each cluster's aggregate over its union mask; clients and the
  aggregation server hold the public key. Clients do not decrypt.
- Clustering happens once, in an initialization phase before round one (Algorithm 3, phase 1):
  every client trains `cluster_epochs` (default 1, appendix E's "one iteration") local epochs from
  the initial model and uploads Gamma at its trained model. Measured: the further this model
  moves from the shared start (more epochs, larger lr), the worse AP recovers the categories.
  Similarity is the negative Euclidean distance; AP uses sklearn's default preference (median).
- One-client clusters (AP may leave a client alone, and leaves everyone alone when it does not
  converge) join the cluster nearest to them by mean sensitivity distance: the key server decrypts
  each cluster's aggregate, and a cluster of one would reveal that client's update. ARI and the
  silhouette score AP's own clustering; `cluster_count` is what FedAvg uses. A round that samples
  a single member of a cluster still decrypts one update; `single_upload_aggregates` counts those.
- Ground truth for ARI: a client's category is its exact label set under `k-classes`; `iid` is
  one category; `dirichlet` has none (no ARI).
- Budgets: max-abs scaling within each cluster (section 3.2, N^c); Algorithm 3 scales over all
  clients instead (`budget_scope = "all"`). `ratio_cap` scales every budget for the paper's
  equal-encrypted-fraction comparisons (Figs. 5-8); the security level uses the capped budget.
- Objective normalization uses the budget-feasible ranges, which makes the scalarized problem
  an exact top-m prefix (selection.py proves it); the MI bound (8) is a plug-in histogram
  estimate on the uploaded update, met by growing the prefix within the budget.
- What is encrypted is the client's update (the engine's wire unit), not its weights.
- The aggregation server adds ciphertexts and, where a client sent an entry of the union in
  plaintext, the encryption of that plaintext under the public key.
- Per-cluster models live in each member's `client.local` (personalized, all entries, so they
  are where local training starts); the engine's global model is the sample-weighted mean of
  the cluster models. The server knows the cluster models here, as the engine lets a server
  behind a key server learn decrypted aggregates.
- Time: round_time_* model each client's protection time (sensitivity, solving, encryption;
  measured) scaled by its CPU share, plus upload bytes over its bandwidth; training excluded.
"""
from defenses.sensecrypt import baselines, protocol, tiny_model  # noqa: F401  (registration)
from defenses.sensecrypt.protocol import SenseCrypt

__all__ = ["SenseCrypt"]
