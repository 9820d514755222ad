"""Installing plugins the way pip does, for tests: a distribution's modules and a dist-info with its
METADATA and entry_points.txt on a temporary path, seen by this process (`Site.install`, which re-reads
the installed plugins) or by a `leakbench` subprocess (`Site.cli`)."""
from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from bench.registry import rescan

ROOT = Path(__file__).resolve().parents[1]
TINY_TOML = """name = "{name}"
[[scenarios]]
name = "tiny"
dataset = "{dataset}"
model = "{model}"
num_clients = 2
clients_per_round = 2
rounds = 1
max_train = 120
max_test = 60
"""


def suite_toml(path: Path, defenses: list[str], attacks: list[str], name: str = "plugged", dataset: str = "digits",
               model: str = "mlp") -> Path:
    """A one-scenario suite on digits (seconds) over `defenses` x `attacks`."""
    text = TINY_TOML.format(name=name, dataset=dataset, model=model)
    text += "".join(f'[[defenses]]\nname = "{d}"\n' for d in defenses)
    text += "".join(f'[[attacks]]\nname = "{a}"\n' for a in attacks)
    path.write_text(text)
    return path


class Site:
    """A site-packages-like folder on sys.path holding the distributions a test installs."""

    def __init__(self, path: Path, cache: Path):
        self.path, self.cache = path, cache
        path.mkdir(parents=True, exist_ok=True)

    def write(self, dist: str, files: dict[str, str], entry_points: dict[str, dict[str, str]],
              version: str = "1.0") -> None:
        for rel, text in files.items():
            target = self.path / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(textwrap.dedent(text))
        info = self.path / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir(exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        (info / "entry_points.txt").write_text("".join(
            f"[{group}]\n" + "".join(f"{name} = {value}\n" for name, value in eps.items())
            for group, eps in entry_points.items()))

    def install(self, dist: str, files: dict[str, str], entry_points: dict[str, dict[str, str]],
                version: str = "1.0") -> None:
        """Write the distribution and let this process load it, as a fresh process would."""
        self.write(dist, files, entry_points, version)
        self.reload()

    def reload(self) -> None:
        """Forget the modules imported from this site (an edit takes effect) and re-read the plugins."""
        for name, module in list(sys.modules.items()):
            file = getattr(module, "__file__", None)
            if file and Path(file).is_relative_to(self.path):
                del sys.modules[name]
        importlib.invalidate_caches()
        rescan()

    def cli(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        """`python -m bench ARGS` in a fresh process that has this site's plugins installed."""
        env = {**os.environ, "PYTHONPATH": str(self.path), "LEAKBENCH_CACHE": str(self.cache)}
        return subprocess.run([sys.executable, "-m", "bench", *args], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=timeout)
