"""SHE-LoRA (Liu, Yan, Li, Yu, Shen, ICLR 2026): selective HE for federated LoRA on heterogeneous devices.

Modules: lora (importance, swapping, reparameterization), negotiation (OPE and Algorithm 1),
he (CKKS column blocks, server-side B * A^cipher), protocol (the she-lora and flex-lora defenses).
"""
from defenses.shelora import protocol  # noqa: F401  (registration)
