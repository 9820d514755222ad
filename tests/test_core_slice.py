"""A slice of the standard evaluation through the same code path as the committed one: `leakbench run core`
(load, load-time checks with the n/a rule, the grid point's federated runs, scoring, the store), then
`leakbench site` over it and the committed front page's rules: the plaintext row calibrates iLRG, FedHE-Full is
blocked by design, the LoRA-only defenses are n/a with their reason."""
import json

from bench.cli import main
from leaderboards.grid import grid


def test_a_slice_of_core_runs_and_heads_the_front_page(tmp_path, data_root):
    out = tmp_path / "core"
    only = "cifar10-lenet-labels-b32/plaintext/ilrg"
    assert main(["run", "core", "--out", str(out), "--only", only, "--data-root", str(data_root)]) == 0
    assert main(["run", "core", "--out", str(out), "--only", "cifar10-lenet-labels-b32/fedhe-full/ilrg",
                 "--data-root", str(data_root)]) == 0
    records = json.loads((out / "results.json").read_text())
    info = json.loads((out / "pages.json").read_text())["core"]
    assert {r["defense"]: r["details"]["undefended"] for r in records} == {"plaintext": True, "fedhe-full": False}
    assert info["untrained"] == ["base"]   # the language membership scenario's yardstick of utility
    assert "no LoRA adapters" in info["not_applicable"]["cifar10-lenet-labels-b32"]["she-lora(budget=0.01)"]
    plain = next(r for r in records if r["defense"] == "plaintext")
    assert plain["metrics"]["label_acc"] == 1.0 and plain["metrics"]["test_samples"] == 500
    board = grid("core", records, info)
    rows = {r["name"]: r for r in board["rows"]}
    cols = [c["attack"] for c in board["columns"]]
    assert dict(zip(cols, rows["plaintext"]["cells"]))["ilrg"]["verdict"].text == "labels recovered"
    assert dict(zip(cols, rows["fedhe-full"]["cells"]))["ilrg"]["kind"] == "blocked"
    assert main(["site", str(tmp_path), "--date", "2026-01-01"]) == 0
    page = (tmp_path / "index.html").read_text()
    assert 'id="core-grid"' in page and "labels recovered" in page
