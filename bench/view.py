"""Old import path, kept working for this release: the contents live in bench.protocol.view
(`from bench import ...` gives the plugin API in one import)."""
from bench.protocol.view import *  # noqa: F401,F403
