"""Old import path, kept working for this release: the contents live in bench.protocol.defense and bench.protocol.payloads
(`from bench import ...` gives the plugin API in one import)."""
from bench.protocol.defense import *  # noqa: F401,F403
from bench.protocol.payloads import *  # noqa: F401,F403
