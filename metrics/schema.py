"""Old import path, kept working for this release: the contents live in bench.protocol.evidence
(`from bench import ...` gives the plugin API in one import)."""
from bench.protocol.evidence import *  # noqa: F401,F403
