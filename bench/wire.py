"""Old import path, kept working for this release: the contents live in bench.protocol.wire
(`from bench import ...` gives the plugin API in one import)."""
from bench.protocol.wire import *  # noqa: F401,F403
