"""A rendered multi-table page in a real browser (headless Chromium via selenium): clicking a header sorts
its own table, in the second and third table too, and the page is not blank at 1400 px."""
import shutil

import pytest

from bench.registry import ATTACKS, METRICS
from leaderboards.render import render


def _record(scenario, defense, attack, status, metrics, reason=""):
    return {"cell_id": f"{scenario}-{defense}-{attack}", "suite": "browser", "scenario": scenario,
            "defense": defense, "defense_params": {}, "attack": attack, "attack_params": {}, "status": status,
            "reason": reason, "metrics": metrics,
            "details": {"key_topology": "shared client key", "family": ATTACKS.get(attack).family,
                        "metric_schema": {m: METRICS.get(m).snapshot() for m in metrics}}}


def _records():
    out = []
    for s, scenario in enumerate(("first", "second", "third")):
        for d in range(5):
            defense = f"def{d}"
            acc = {"accuracy": round(0.5 + 0.1 * ((d * 3 + s) % 5), 3), "upload_bytes": 1000.0 * (d + 1)}
            if d == 4:
                out.append(_record(scenario, defense, "idlg", "blocked", acc, "blocked by design: empty view"))
            else:
                out.append(_record(scenario, defense, "idlg", "ok",
                                   {**acc, "psnr": 10.0 + ((d * 7 + s * 3) % 5), "label_acc": 1.0}))
            out.append(_record(scenario, defense, "ilrg", "ok", {**acc, "lnacc": round(0.2 * ((d * 2 + s) % 5), 3)}))
    return out


def _driver(tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not binary or not driver:
        pytest.skip("no chromium/chromedriver on PATH (Debian: apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1400,1000", f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(driver), options=options)


def _column_values(table, col):
    return table.parent.execute_script(
        "var t = arguments[0], col = arguments[1];"
        "return Array.from(t.tBodies[0].rows).map(function (r) {"
        "  var c = leakbenchCell(r, col); return c ? c.dataset.sort : null; });", table, col)


def test_sorting_works_in_every_table_and_the_page_is_not_blank(tmp_path):
    pytest.importorskip("selenium")
    page = render(_records(), {"browser": {"description": "three scenarios"}}, tmp_path / "site")
    browser = _driver(tmp_path)
    try:
        browser.get(page.as_uri())
        tables = browser.find_elements("css selector", "table.leaderboard")
        assert len(tables) == 3
        for table in tables[1:]:  # the second and the third table
            for header_text in ("accuracy", "LnAcc"):
                header = next(h for h in table.find_elements("css selector", "thead th.sortable")
                              if h.text.startswith(header_text))
                col = int(header.get_attribute("data-col"))
                header.click()
                values = [float(v) for v in _column_values(table, col)]
                assert values == sorted(values), (header_text, values)
                header.click()
                values = [float(v) for v in _column_values(table, col)]
                assert values == sorted(values, reverse=True), (header_text, values)
        shot = tmp_path / "page.png"
        assert browser.save_screenshot(str(shot))
    finally:
        browser.quit()
    from PIL import Image
    image = Image.open(shot).convert("L")
    lo, hi = image.getextrema()
    assert image.size[0] >= 1300 and hi - lo > 100, "the screenshot is blank"
    assert len(image.getcolors(1 << 16) or []) > 20
