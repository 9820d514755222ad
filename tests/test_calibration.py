"""The standard evaluation's rules on hand-built records: an attack that fails on the undefended row judges
nothing; a row at chance ranks below a useful one and is never called best; an n/a grid point carries its
reason (page info, from Defense.applicable at load); the core grid on the front page."""
import pytest

from test_leaderboard import _cells, rec

from bench.run.spec import parse_suite
from bench.evaluation.calibration import Calibration, calibrate
from leaderboards.grid import grid
from leaderboards.tables import attack_label, scenario_table
from bench.evaluation.usefulness import no_utility, useless, wilson

INFO = {"undefended": ["plain"], "untrained": ["base"], "chance": {"s": 0.1}}


def test_an_attack_that_fails_on_the_undefended_row_gives_no_verdict():
    records = [rec("plain", "idlg", psnr=11.0, accuracy=0.9), rec("plain", "ilrg", label_acc=1.0, accuracy=0.9),
               rec("mask", "idlg", psnr=9.8, accuracy=0.85), rec("mask", "ilrg", label_acc=0.0, accuracy=0.85)]
    cal = calibrate(records, attack_label)
    assert not cal["idlg"].ok and "fails without a defense here (plain psnr 11)" in cal["idlg"].why
    assert cal["ilrg"].ok
    table = scenario_table(records, INFO)
    keys = [c.key for c in table["groups"][0].columns]
    mask = _cells(table, "mask")
    assert mask[keys.index("psnr")]["text"] == "no verdict"           # not "image not recovered"
    row = next(r for r in table["rows"] if r["defense"] == "mask")
    assert row["verdict"].text == "labels not recovered"             # judged by the calibrated attack alone
    idlg = next(g for g in table["groups"] if g.name == "idlg")
    assert idlg.nocal.startswith("no verdict: the attack fails")
    # the same records without page info judge the same: the records say which row is undefended
    assert next(r for r in scenario_table(records)["rows"] if r["defense"] == "mask")["verdict"].text == \
        "labels not recovered"


def test_an_image_attack_is_calibrated_and_judged_on_its_images_not_its_labels():
    records = [rec("plain", "inverting-gradients", psnr=12.0, label_acc=1.0),
               rec("mask", "inverting-gradients", psnr=11.0, label_acc=1.0)]
    assert not calibrate(records, attack_label)["inverting-gradients"].ok   # labels alone do not calibrate it
    records[0]["metrics"]["psnr"] = 35.0
    cell = grid("core", records, INFO)["rows"]
    mask = next(r for r in cell if r["name"] == "mask")["cells"][0]
    assert mask["verdict"].text == "image not recovered"


def test_without_an_undefended_row_nothing_is_calibrated():
    records = [rec("mask", "idlg", psnr=35.0, accuracy=0.85)]
    assert not calibrate(records, attack_label)["idlg"].ok
    assert scenario_table(records, INFO)["rows"][0]["verdict"].text == "no verdict"


def test_a_parameterized_row_is_undefended_only_at_its_unprotected_setting():
    """Flex-LoRA without noise is the LoRA scenarios' undefended row (as its record stores it); with noise it is
    judged."""
    from bench.registry import DEFENSES
    assert DEFENSES.get("flex-lora")(sigma=0.0).undefended() and not DEFENSES.get("flex-lora")(sigma=0.001).undefended()
    assert DEFENSES.get("plaintext")().undefended() and not DEFENSES.get("fedhe-full")().undefended()
    plain, noisy = rec("flex-lora", "dager", rouge1=1.0), rec("flex-lora", "dager", rouge1=0.0)
    plain["defense_params"], noisy["defense_params"] = {"sigma": 0.0}, {"sigma": 0.001}
    plain["details"]["undefended"] = True
    assert calibrate([plain, noisy], attack_label)["dager"].ok
    assert not calibrate([noisy], attack_label)["dager"].ok


def test_a_chance_level_defense_ranks_below_a_useful_one_and_is_flagged():
    records = [rec("plain", "idlg", psnr=35.0, accuracy=0.9, test_samples=500),
               rec("useful", "idlg", psnr=20.0, accuracy=0.8, test_samples=500),
               rec("chance", "idlg", "blocked", "blocked by design: empty view", accuracy=0.098, test_samples=500)]
    table = scenario_table(records, INFO)
    order = [r["defense"] for r in table["rows"]]
    assert order.index("useful") < order.index("chance")             # blocked, but its model learned nothing
    chance = next(r for r in table["rows"] if r["defense"] == "chance")
    assert "contains chance (0.100)" in chance["no_utility"]
    assert next(r for r in table["rows"] if r["defense"] == "useful")["no_utility"] == ""


def test_a_scenario_whose_undefended_row_is_at_chance_flags_nothing():
    from leaderboards.tables import defense_label
    from bench.evaluation.usefulness import useless
    records = [rec("plain", "dager", rouge1=1.0, accuracy=0.5, test_samples=16, chance_accuracy=0.5),
               rec("he", "dager", rouge1=0.0, accuracy=0.5, test_samples=16, chance_accuracy=0.5)]
    assert useless(records, INFO, "s", defense_label) == {}
    records[0]["metrics"]["accuracy"] = 1.0                           # now the scenario measures utility
    assert set(useless(records, INFO, "s", defense_label)) == {"he"}


def test_no_utility_reads_the_interval_perplexity_and_divergence():
    low, high = wilson(0.12, 500)
    assert low < 0.1 < high
    assert no_utility({"status": "ok", "metrics": {"accuracy": 0.12, "test_samples": 500}}, 0.1, None)
    assert not no_utility({"status": "ok", "metrics": {"accuracy": 0.2, "test_samples": 500}}, 0.1, None)
    assert no_utility({"status": "ok", "metrics": {"accuracy": 0.13}}, 0.1, None)   # no size: within 0.05
    assert no_utility({"status": "ok", "metrics": {"perplexity": 300.0}}, None, 279.0)
    assert not no_utility({"status": "ok", "metrics": {"perplexity": 136.0}}, None, 279.0)
    assert no_utility({"status": "diverged", "metrics": {}}, None, None) == "training diverged"


def test_a_defense_that_cannot_apply_is_na_with_its_declared_reason(tmp_path):
    from bench.run.preflight import preflight

    suite = parse_suite({"name": "na", "scenarios": [{"name": "d", "dataset": "digits", "model": "mlp", "rounds": 1,
                                                      "num_clients": 2, "clients_per_round": 2}],
                         "defenses": [{"name": "plaintext"}, {"name": "she-lora"}],
                         "attacks": [{"name": "ilrg"}]})
    checked = preflight(suite, None)
    assert [c.defense.name for c in checked.cells] == ["plaintext"]
    na = checked.page_info()["not_applicable"]
    assert "she-lora" in na["d"] and "no LoRA adapters" in na["d"]["she-lora"]


def test_the_core_grid_counts_coverage_and_shows_every_symbol():
    info = {**INFO, "not_applicable": {"s": {"lora-only": "model 'mlp' trains no LoRA adapters"}}}
    records = [rec("plain", "idlg", psnr=[36.0, 34.0], accuracy=0.9, test_samples=500),
               rec("plain", "ilrg", label_acc=0.2, accuracy=0.9, test_samples=500),
               rec("he", "idlg", "blocked", "blocked by design: empty view", accuracy=0.88, test_samples=500),
               rec("he", "ilrg", "blocked", "blocked by design: empty view", accuracy=0.88, test_samples=500),
               rec("noise", "idlg", psnr=[12.0, 13.0], accuracy=0.11, test_samples=500)]
    core = grid("core", records, info)
    cols = [c["attack"] for c in core["columns"]]
    rows = {r["name"]: r for r in core["rows"]}
    # noise, 1 of 2 cells computed, is not ranked: it follows the ranked rows, and the row n/a throughout comes last
    assert [(r["name"], r["rank"]) for r in core["rows"]] == [("he", 1), ("plain", 2), ("noise", None),
                                                              ("lora-only", None)]
    noise = dict(zip(cols, rows["noise"]["cells"]))
    assert noise["idlg"]["verdict"].text == "image not recovered" and noise["idlg"]["support"] == "2 attacked uploads"
    assert noise["ilrg"]["kind"] == "missing" and rows["noise"]["measured"] == 1 and rows["noise"]["applicable"] == 2
    plain = dict(zip(cols, rows["plain"]["cells"]))
    assert plain["ilrg"]["kind"] == "uncal" and plain["idlg"]["verdict"].level == "leak"
    assert dict(zip(cols, rows["he"]["cells"]))["idlg"]["kind"] == "blocked"
    assert rows["he"]["measured"] == rows["he"]["applicable"] == 2
    lora = rows["lora-only"]                                          # no record: a row of n/a cells with reasons
    assert [c["kind"] for c in lora["cells"]] == ["na", "na"] and lora["applicable"] == 0
    assert "no LoRA adapters" in lora["cells"][0]["verdict"].why and lora["verdict"].text == "n/a"


def test_an_attack_on_fedsgd_and_fedavg_uploads_gets_a_column_for_each():
    def on(update, *args, **metrics):
        r = rec(*args, scenario=update, **metrics)
        r["config"] = {"scenario": {"attack_update": update}}
        return r
    records = [on("gradient", "plain", "ilrg", label_acc=1.0), on("gradient", "mask", "ilrg", label_acc=0.0),
               on("delta", "plain", "ilrg", label_acc=0.9), on("delta", "mask", "ilrg", label_acc=0.6)]
    core = grid("core", records, INFO)
    assert [(c["attack"], c["upload"]) for c in core["columns"]] == [("ilrg", ""), ("ilrg", "FedAvg update")]
    mask = next(r for r in core["rows"] if r["name"] == "mask")["cells"]
    assert [c["verdict"].level for c in mask] == ["resisted", "partial"]   # leakage after local training, apart


def test_paper_rows_say_who_reported_and_whether_ours_agrees():
    from bench.evaluation.pages import check_paper
    from leaderboards.paper import paper_rows
    import pytest

    records = [rec("plain", "ilrg", lnacc=0.95), rec("mask", "ilrg", lnacc=0.004)]
    rows = paper_rows([{"metric": "lnacc", "reported": 1.0, "source": "T2", "defense": "plain"},
                       {"metric": "lnacc", "reported": 0.9, "source": "rerun", "defense": "mask",
                        "reported_by": "official code", "tolerance": 0.05}], records)
    assert rows[0]["agrees"] and rows[0]["reported_by"] == "paper" and rows[0]["ratio_text"] == "0.95"
    assert rows[1]["agrees"] is False and rows[1]["reported_by"] == "official code"
    assert rows[1]["ratio_text"] == "0.0044"                          # not "0.00"
    with pytest.raises(ValueError, match="reported_by"):
        check_paper({"metric": "lnacc", "reported": 1.0, "reported_by": "a blog"})


def test_a_malicious_server_attack_forms_its_own_columns():
    records = [rec("plain", "idlg", psnr=35.0, accuracy=0.9), rec("he", "idlg", psnr=12.0, accuracy=0.9)]
    for r, value in zip([rec("plain", "imprint", psnr=40.0, images_recovered=0.9, accuracy=0.9),
                         rec("he", "imprint", psnr=41.0, images_recovered=0.95, accuracy=0.9)], (0.9, 0.95)):
        r["details"]["threat_model"] = "malicious-model"
        records.append(r)
    core = grid("core", records, INFO)
    assert [(c["attack"], c["family"]) for c in core["columns"]] == [("idlg", "image"),
                                                                      ("imprint", "image · malicious server")]
    assert core["columns"][1]["key"] == "images_recovered"
    he = dict(zip(["idlg", "imprint"], next(r for r in core["rows"] if r["name"] == "he")["cells"]))
    assert he["idlg"]["verdict"].text == "image not recovered" and he["imprint"]["verdict"].text == "image recovered"


def test_across_suites_a_defense_judged_only_by_uncalibrated_attacks_keeps_its_row():
    from leaderboards.overview import overview

    records = [rec("mask", "ilrg", label_acc=1.0, accuracy=0.9)]   # no undefended row in its scenario
    board = overview([{"name": "t", "records": records, "infos": {"t": INFO}}])
    row = next(r for r in board["rows"] if r["name"] == "mask")
    assert row["cells"][0]["verdict"].text == "no verdict"


def test_a_rows_utility_headline_is_its_largest_relative_loss_across_metrics():
    """A perplexity rise of 2 on 100 (2 %) is a smaller loss than an accuracy drop of 0.05 on 0.5 (10 %)."""
    info = {**INFO, "chance": {"img": 0.1}}
    records = [rec("plain", "mia-loss", scenario="img", mia_auroc=0.8, accuracy=0.5, test_samples=500),
               rec("mask", "mia-loss", scenario="img", mia_auroc=0.5, accuracy=0.45, test_samples=500),
               rec("plain", "mia-ref", scenario="lm", mia_auroc=0.8, perplexity=100.0),
               rec("mask", "mia-ref", scenario="lm", mia_auroc=0.5, perplexity=102.0)]
    mask = next(r for r in grid("core", records, info)["rows"] if r["name"] == "mask")
    assert [u["scenario"] for u in mask["utility"]] == ["img", "lm"]
    assert mask["utility"][0]["relative"] == pytest.approx(0.1) and mask["utility"][1]["relative"] == pytest.approx(0.02)
    assert mask["utility"][0]["loss"] == pytest.approx(0.05) and mask["utility"][1]["loss"] == pytest.approx(1.02)


def test_a_reference_floor_first_or_an_undefended_row_that_did_not_run_calibrates_nothing_wrongly():
    """Kills mutants of bench/evaluation/calibration.py that survived the earlier tests (docs/mutation.md): a reference
    floor listed first must not end the calibration of the attacks after it (`continue` -> `break`); an undefended
    row that did not run gives no verdict and says which row and why; no undefended row says that."""
    records = [rec("plain", "random-guess", label_acc=0.1), rec("plain", "ilrg", label_acc=1.0),
               rec("plain", "idlg", "failed", "RuntimeError: boom"), rec("mask", "dlg", psnr=30.0)]
    cal = calibrate(records, attack_label)
    assert "random-guess" not in cal and cal["ilrg"].ok
    assert not cal["idlg"].ok and cal["idlg"].why == "its undefended row (plain) is failed"
    assert cal["dlg"] == Calibration(False, "no undefended row in this scenario to calibrate the attack against")


def test_the_untrained_row_is_the_perplexity_yardstick_and_never_judged():
    """Kills mutants of bench/evaluation/usefulness.py that survived (docs/mutation.md): the untrained rows (page info
    `untrained`) give the perplexity a trained row must beat, and are left out of the rows judged."""
    records = [rec("base", "mia-ref", scenario="lm", perplexity=300.0), rec("base", "mia-ref", scenario="lm",
                                                                          perplexity=280.0),
               rec("plain", "mia-ref", scenario="lm", perplexity=40.0),
               rec("mask", "mia-ref", scenario="lm", perplexity=290.0)]
    out = useless(records, {"undefended": ["plain"], "untrained": ["base"]}, "lm", lambda r: r["defense"])
    assert out == {"mask": "perplexity 290 no better than the untrained model's 280"}


def test_an_attack_no_better_than_the_chance_floor_on_the_undefended_row_gives_no_verdict():
    """A label accuracy above the band's cut but not above random guessing's interval breaks nothing; beyond the
    floor's interval it does."""
    floor = rec("plain", "random-guess", label_acc=0.5)
    floor["details"]["label_acc_ci95"] = [0.45, 0.56]
    records = [floor, rec("plain", "llg-plus", label_acc=0.55), rec("plain", "llg-plus-entries", label_acc=0.86)]
    cal = calibrate(records, attack_label)
    assert not cal["llg-plus"].ok
    assert cal["llg-plus"].why == "on plain it is no better than chance (label_acc 0.55 against random-guess's 0.5 " \
                                  "[0.45, 0.56])"
    assert cal["llg-plus-entries"].ok


def test_a_utility_loss_is_paired_where_the_records_store_packed_per_example_outcomes():
    """The cell scorer stores per-example outcomes packed (pack_bits); the utility loss reads them back paired."""
    from bench.evaluation.utility_loss import utility_loss
    from bench.models.losses import pack_bits

    plain, other = [1] * 90 + [0] * 10, [1] * 85 + [0] * 15
    records = [rec("plain", "ilrg", label_acc=1.0, accuracy=0.9, test_samples=100),
               rec("mask", "ilrg", label_acc=1.0, accuracy=0.85, test_samples=100)]
    for r, bits in zip(records, (plain, other)):
        r["details"]["per_example"] = {"correct": pack_bits(bits), "n": len(bits)}
    loss = utility_loss(records[1], records[0])
    assert loss["paired"] and abs(loss["loss"] - 0.05) < 1e-9
