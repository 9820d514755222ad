"""Old import path, kept working for this release: the contents live in bench.protocol.attack
(`from bench import ...` gives the plugin API in one import)."""
from bench.protocol.attack import *  # noqa: F401,F403
