"""Key provisioning by topology: who holds the secret key, who gets public material only.

`shared-client-key`: a key authority hands the full context to every client (the
FedHE-Full / FedML-HE / MaskCrypt setting) and the aggregation server gets the public
context. `key-server`: a separate key server alone holds the secret; clients and the
aggregation server get public material only. The traffic of provisioning is logged.
"""
from __future__ import annotations

from bench.crypto import KeyMaterial, choose_ckks_params, ckks_keygen, paillier_keygen

TOPOLOGIES = ("shared-client-key", "key-server")


def provision(fed, topology: str, scheme: str = "ckks", **options) -> KeyMaterial:
    if topology not in TOPOLOGIES:
        raise ValueError(f"key topology '{topology}' must be one of {', '.join(TOPOLOGIES)}")
    if scheme == "ckks":
        # headroom for every client: Poisson sampling may pick more than clients_per_round
        km = ckks_keygen(options.get("params") or choose_ckks_params(fed.scenario.clients_per_round),
                         max_summands=fed.scenario.num_clients)
    else:
        km = paillier_keygen(**options)
    public = km.public_only()
    fed.parties["server"].keys[scheme] = public
    fed.send("key-server", "server", f"{scheme} public context", public.public)
    holder = fed.parties["key-server"] if topology == "key-server" else None
    if holder is not None:
        holder.keys[scheme] = km
    for client in fed.clients:
        client.party.keys[scheme] = public if holder else km
        fed.send("key-server", client.name, f"{scheme} context", public.public if holder else km.public + km.secret)
    return km
