"""DAGER (Petrov et al., NeurIPS 2024): text recovered exactly from a transformer's gradients by span checks.

attack.py is the registered attack; span.py the low-rank span tests, layer1.py and decoder.py / search.py the
token and sentence searches (noise.py their noisy-gradient variants), arch.py / layouts.py / llama.py the model
families it reads, hidden.py the LoRA path that solves the columns of A a defense hid, tokens.py the first stage
alone (the set of tokens) where the server does not know the weights the client started from.
"""
from attacks.dager.attack import Dager, visible_block

__all__ = ["Dager", "visible_block"]
