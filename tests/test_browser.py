"""Rendered pages in a real browser (headless Chromium via selenium, 1400 px wide), walked whole: every
sortable header sorts its own table best-first on the first click (by the column's direction), the page body
never scrolls sideways (wide tables scroll inside their containers), every link and image resolves, and the
console stays free of errors. Two walks: a small site rendered here from hand-built records, and every committed
page under leaderboards/results (about ten seconds, so both run by default and in CI)."""
import base64
import io
import json
import re
import shutil
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from bench.registry import ATTACKS, METRICS
from leaderboards.site import build_site
from tests.conftest import consistent

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "leaderboards" / "results"

# What the browser reports of every sortable table, read from the DOM only, never through the page's own
# leakbenchKey / leakbenchCell / data-dir: each row's cells (colspan, data-sort, text) once, then for every sortable
# header its position, and the rows' order before and after it is clicked (rows told apart by a mark set here).
CLICK_EVERY_HEADER = """
var out = [];
document.querySelectorAll("table.sortable").forEach(function (table, t) {
  var body = table.tBodies[0], columns = [];
  function order() { return Array.from(body.rows).map(function (row) { return +row.getAttribute("data-oracle"); }); }
  var cells = Array.from(body.rows).map(function (row, i) {
    row.setAttribute("data-oracle", i);
    return Array.from(row.cells).map(function (c) {
      return [c.colSpan || 1, c.hasAttribute("data-sort") ? c.getAttribute("data-sort") : null, c.textContent.trim()];
    });
  });
  table.querySelectorAll("thead th.sortable").forEach(function (th) {
    var pos = 0, sib = th.previousElementSibling, sub = th.querySelector(".sub"), before = order();
    for (; sib; sib = sib.previousElementSibling) pos += sib.colSpan || 1;
    th.click();
    columns.push({pos: pos, col: th.getAttribute("data-col"), head: th.childNodes[0].textContent.trim(),
                  sub: sub ? sub.textContent.trim() : "", text: th.textContent.trim(),
                  sorted: th.getAttribute("data-sorted") || "", before: before, after: order()});
  });
  out.push({table: t, id: table.id, cls: table.className, cells: cells, columns: columns});
});
return out;
"""
# The browser's own string collation (what a sorted text column follows), without any of the page's code.
COLLATE = """
var texts = arguments[0].slice().sort(function (a, b) { return a.localeCompare(b); }), rank = {}, r = 0;
texts.forEach(function (t, i) { if (i && texts[i - 1].localeCompare(t) !== 0) r++; rank[t] = r; });
return rank;
"""
# Best-first for the columns that are not one metric, stated here rather than read from the page; every other
# column is a metric (its direction from the registry) or, in the core grid, an attack's verdict (least severe first).
FIXED_DIRECTIONS = {
    "scenario": {"rank": "asc", "defense": "asc", "verdict": "asc", "key topology": "asc",
                 "status": "asc"},   # an attack whose every cell failed or was blocked shows their status
    "board": {"defense": "asc", "verdict": "asc", "utility cost": "asc", "HE cost": "asc"},
    "core-grid": {"defense": "asc", "verdict": "asc", "coverage": "desc", "HE cost": "asc"},
    "suites": {"suite": "asc", "scenarios": "desc", "cells": "desc", "ok": "desc", "blocked": "desc",
               "diverged": "desc", "failed": "asc"},
    "paper": {"metric": "asc", "cells matched": "asc", "source": "asc", "reported": "desc", "ours": "desc",
              "ours / reported": "desc", "agrees?": "asc", "note": "asc"},
    "schema": {"name": "asc", "shown as": "asc", "kind": "asc", "unit": "asc", "better": "asc"},
}


def _header(title: str, unit: str) -> str:
    """A metric's column header as a page writes it: its title, words spaced, a trailing " s" read "time"."""
    text = title.replace("_", " ")
    return text[:-2] + " time" if unit == "s" and text.endswith(" s") else text


def metric_headers(root: Path) -> dict[str, str]:
    """Header -> metric name: today's registry, and the titles the records under root were stored with (a renamed
    display keeps its old header there). Only the name is taken from a record; the direction is the registry's."""
    names: dict[str, set[str]] = {}
    for name in METRICS.names():
        m = METRICS.get(name)
        names.setdefault(_header(m.title, m.unit), set()).add(name)
    for export in root.glob("*/results.json"):
        for rec in json.loads(export.read_text()):
            for name, snap in rec["details"].get("metric_schema", {}).items():
                names.setdefault(_header(snap.get("title") or name, snap.get("unit", "")), set()).add(name)
    return {h: next(iter(n)) for h, n in names.items() if len(n) == 1}


def _table_kind(column: dict) -> str:
    if column["id"].startswith("tbl-"):
        return "scenario"
    if column["id"] in ("board", "core-grid"):
        return column["id"]
    return next((k for k in ("paper", "schema") if k in column["cls"].split()), "suites")


def expected_direction(column: dict, headers: dict[str, str]) -> str:
    """Best-first for one column: descending where the registry says higher is better for the client."""
    kind, head = _table_kind(column), column["head"]
    if head in FIXED_DIRECTIONS[kind]:
        return FIXED_DIRECTIONS[kind][head]
    if kind == "core-grid":   # an attack's column: its cells sort on the verdict's severity
        return "asc"
    written = (column["sub"].removeprefix("worst ") if kind == "board" else head).rstrip(" ↑↓")
    found = [h for h in headers if written == h or written.startswith(h + " (")]
    assert found, f"column '{column['text']}' is no metric the registry or the records know; name its direction"
    name = headers[max(found, key=len)]
    assert name in METRICS.names(), f"column '{column['text']}': metric {name} is not in today's registry"
    return "desc" if METRICS.get(name).lower_is_better is False else "asc"


def _cell(row: list, col: int):
    pos = 0
    for cell in row:
        if col < pos + cell[0]:
            return cell
        pos += cell[0]
    return None


def _key(cell) -> tuple[int, object]:
    """Numbers (data-sort) first, then text, then blanks (no cell, empty or a dash)."""
    if cell is None:
        return 2, ""
    raw = cell[1]
    try:
        number = float(raw) if raw not in (None, "") else None
    except ValueError:
        number = None
    if number is not None and number == number:
        return 0, number
    return (2, "") if cell[2] in ("", "–") else (1, cell[2])


def sort_problems(browser, headers: dict[str, str]) -> list[str]:
    """Click every sortable header of the open page and compare the rows' order with the order re-sorted here
    from the cells' data-sort values and the column's direction (stable: ties keep the order before the click)."""
    tables = browser.execute_script(CLICK_EVERY_HEADER)
    keys = [[[_key(_cell(row, c["pos"])) for row in t["cells"]] for c in t["columns"]] for t in tables]
    texts = sorted({v for table in keys for column in table for kind, v in column if kind == 1})
    rank = browser.execute_script(COLLATE, texts) if texts else {}
    problems = []
    for t, table in zip(tables, keys):
        for c, key in zip(t["columns"], table):
            where = f"table {t['table']} '{c['text']}'"
            if str(c["pos"]) != c["col"]:
                problems.append(f"{where}: data-col {c['col']} but the header stands at column {c['pos']}")
            direction = expected_direction({**t, **c}, headers)
            sign = -1 if direction == "desc" else 1
            want = sorted(c["before"], key=lambda i: (key[i][0], sign * (key[i][1] if key[i][0] == 0 else
                                                                           rank[key[i][1]] if key[i][0] == 1 else 0)))
            if c["after"] != want:
                shown = ", ".join(str(key[i][1]) for i in c["after"])
                problems.append(f"{where}: rows not sorted {direction} by data-sort: {shown[:300]}")
            if c["sorted"] != direction:
                problems.append(f"{where}: first click marked '{c['sorted']}', best-first is '{direction}'")
    return problems


def _record(suite, scenario, defense, attack, status, metrics, reason="", details=None, params=None):
    return consistent({
        "suite": suite, "scenario": scenario, "defense": defense, "defense_params": params or {}, "attack": attack,
        "attack_params": {}, "status": status, "reason": reason, "metrics": metrics,
        "environment": {"leakbench": "0.1.0", "fingerprint": "0123456789abcdef"},
        "details": {"key_topology": "shared-client-key" if defense != "plaintext" else "none",
                    "family": ATTACKS.get(attack).family, "undefended": defense == "plaintext",
                    "metric_schema": {m: METRICS.get(m).snapshot() for m in metrics},
                    "sources": {"defense": {"about": f"{defense}, a test row", "paper": "https://example.org/p"},
                                "attack": {"about": attack, "code": "https://example.org/c"}},
                    **(details or {})}})


def small_site(root: Path) -> Path:
    """Two suites: images and labels over three scenarios; text and membership over one."""
    recs = []
    for s, scenario in enumerate(("first", "second", "third")):
        for d in range(5):
            defense = "plaintext" if d == 0 else "selective"
            params = {} if d == 0 else {"ratio": 0.1 * d, "freeze_rest": False}
            run = {"accuracy": round(0.5 + 0.1 * ((d * 3 + s) % 5), 3), "upload_bytes": 1000.0 * (d + 1),
                   "he_encrypt_s": 0.001 * d}
            if d == 4:
                recs.append(_record("vision", scenario, defense, "idlg", "blocked", run, "blocked by design: empty view",
                                    params=params))
            else:
                recs.append(_record("vision", scenario, defense, "idlg", "ok",
                                    {**run, "psnr": 10.0 + ((d * 7 + s * 3) % 5) * 10, "label_acc": 1.0},
                                    details={"per_target": {"psnr": [9.0, 11.0]}}, params=params))
            recs.append(_record("vision", scenario, defense, "ilrg", "ok", {**run, "lnacc": round(0.2 * ((d * 2 + s) % 5), 3)},
                                params=params))
    texts = [{"reference": ["a b c", "d e f"], "recovered": ["d e f", "a b c"], "matched": ["a b c", "d e f"]}]
    scores = {"scores": [0.1 * i for i in range(40)], "labels": [i % 2 for i in range(40)], "n_nonmembers": 20,
              "mia_auroc_ci95": [0.4, 0.7]}
    for d, defense in enumerate(("plaintext", "fedhe-full")):
        run = {"accuracy": 0.8 - 0.1 * d, "upload_bytes": 5e6 * (d + 1)}
        recs.append(_record("words", "lm", defense, "dager", "ok", {**run, "rouge1": 1.0 - d / 2, "exact_match": 1.0},
                            details={"texts": texts}))
        recs.append(_record("words", "lm", defense, "mia-loss", "ok",
                            {**run, "mia_auroc": 0.55, "mia_tpr_at_0.1fpr": "unavailable: needs >= 1000 non-members"},
                            details=scores))
    from leaderboards.render import render
    for suite in ("vision", "words"):
        render([r for r in recs if r["suite"] == suite], {suite: {"description": f"the {suite} suite", "paper": [
            {"metric": "accuracy", "reported": 0.9, "source": "a table", "scenario": "lm" if suite == "words" else "first"}]}},
            root / suite)
    return build_site(root, generated="2026-01-01")


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
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(driver), options=options)


def _ids(page: Path) -> set[str]:
    return set(re.findall(r'\bid="([^"]+)"', page.read_text()))


def _check_links_and_images(page: Path, hrefs: list[str], srcs: list[str]) -> list[str]:
    from PIL import Image

    bad = []
    for href in hrefs:
        url = urlparse(href)
        if url.scheme in ("http", "https"):
            if not url.netloc:
                bad.append(f"{page}: malformed link {href}")
            continue
        if url.scheme not in ("", "file"):
            bad.append(f"{page}: unexpected link {href}")
            continue
        target = page if not url.path else (page.parent / unquote(url.path)).resolve()
        if not target.is_file():
            bad.append(f"{page}: link {href} has no file")
        elif url.fragment and target.suffix == ".html" and unquote(url.fragment) not in _ids(target):
            bad.append(f"{page}: link {href} has no element #{url.fragment}")
    for src in srcs:
        try:
            if src.startswith("data:image/"):
                Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1]))).verify()
            else:
                Image.open(page.parent / unquote(urlparse(src).path)).verify()
        except Exception as err:   # any unreadable image fails the walk
            bad.append(f"{page}: image {src[:60]} does not load: {err}")
    return bad


def walk(root: Path, tmp_path: Path) -> dict[str, int]:
    """Every page under root: sorting, width, links, images, console. Returns counts of what was checked."""
    pages = sorted(root.glob("*.html")) + sorted(root.glob("*/index.html"))
    assert pages, f"no pages under {root}"
    browser, headers = _driver(tmp_path), metric_headers(root)
    problems, counted = [], {"pages": 0, "headers": 0, "links": 0, "images": 0}
    try:
        for page in pages:
            browser.get(page.resolve().as_uri())
            width = browser.execute_script("return [document.documentElement.scrollWidth, window.innerWidth];")
            if width[0] > width[1]:
                problems.append(f"{page}: body {width[0]} px wide in a {width[1]} px window")
            problems += [f"{page}: {f}" for f in sort_problems(browser, headers)]
            hrefs = browser.execute_script("return Array.from(document.querySelectorAll('a[href]'))"
                                           ".map(function (a) { return a.getAttribute('href'); });")
            srcs = browser.execute_script("return Array.from(document.images).map(function (i) { "
                                          "return i.getAttribute('src'); });")
            problems += _check_links_and_images(page, hrefs, srcs)
            problems += [f"{page}: console: {entry['message']}" for entry in browser.get_log("browser")
                         if entry["level"] == "SEVERE"]
            counted["pages"] += 1
            counted["headers"] += browser.execute_script("return document.querySelectorAll('th.sortable').length;")
            counted["links"] += len(hrefs)
            counted["images"] += len(srcs)
        shot = tmp_path / "first.png"
        browser.get(pages[0].resolve().as_uri())
        assert browser.save_screenshot(str(shot))
    finally:
        browser.quit()
    assert not problems, "\n".join(problems[:40])
    from PIL import Image
    image = Image.open(shot).convert("L")
    lo, hi = image.getextrema()
    assert image.size[0] >= 1300 and hi - lo > 100, "the screenshot is blank"
    return counted


def test_every_page_of_a_small_site_sorts_fits_and_resolves(tmp_path):
    pytest.importorskip("selenium")
    small_site(tmp_path / "site")
    counted = walk(tmp_path / "site", tmp_path)
    assert counted["pages"] == 3 and counted["headers"] > 40 and counted["images"] > 3


def test_tabs_show_one_column_group_and_filters_hide_rows(tmp_path):
    pytest.importorskip("selenium")
    front = small_site(tmp_path / "site")
    browser = _driver(tmp_path)
    try:
        browser.get((tmp_path / "site" / "vision" / "index.html").as_uri())
        bar = browser.find_elements("css selector", ".tabs")[0]
        table = browser.find_elements("css selector", "table.leaderboard")[0]
        visible = [h.text for h in table.find_elements("css selector", "thead tr.cols th") if h.is_displayed()]
        assert "PSNR (dB) ↓" in visible and "accuracy ↑" in visible and "upload bytes ↓" not in visible  # overview
        next(b for b in bar.find_elements("css selector", "button") if b.text == "cost").click()
        visible = [h.text for h in table.find_elements("css selector", "thead tr.cols th") if h.is_displayed()]
        assert "upload bytes ↓" in visible and "PSNR (dB) ↓" not in visible and visible[:2] == ["rank", "defense"]
        browser.get(front.as_uri())
        rows = browser.find_elements("css selector", "#board tbody tr")
        assert len(rows) == 3
        browser.find_element("id", "filter-text").send_keys("selective")
        assert [r.is_displayed() for r in rows].count(True) == 1
    finally:
        browser.quit()


def test_every_committed_page_sorts_fits_and_resolves(tmp_path):
    pytest.importorskip("selenium")
    counted = walk(COMMITTED, tmp_path)
    assert counted["pages"] == 1 + len([d for d in COMMITTED.iterdir() if (d / "results.json").is_file()])


def core_site(root: Path, tracks: list | None = None) -> Path:
    """A standard-evaluation suite of 15 defense rows beside a reproduction suite: the front page's grid (with
    `tracks`, its summary by track)."""
    small_site(root)
    recs = []
    for d in range(15):
        defense = "plaintext" if d == 0 else f"defense-{d:02d}"
        run = {"accuracy": 0.11 if d == 7 else 0.8, "test_samples": 500, "upload_bytes": 1000.0 * (d + 1),
               "he_encrypt_s": 0.01 * d}
        psnr = {"psnr": 35.0 - 2 * d, "label_acc": 1.0}
        recs.append(_record("core", "images", defense, "idlg", "blocked" if d == 3 else "ok",
                            run if d == 3 else {**run, **psnr}, "blocked by design: empty view" if d == 3 else "",
                            details={"per_target": {"psnr": [psnr["psnr"]] * 2}}))
        recs.append(_record("core", "images", defense, "ilrg", "ok", {**run, "label_acc": 0.1}))
    from leaderboards.render import render
    render(recs, {"core": {"description": "the standard evaluation", "untrained": [],
                           "chance": {"images": 0.1},
                           "not_applicable": {"images": {"she-lora": "model 'mlp' trains no LoRA adapters"}},
                           **({"tracks": tracks} if tracks else {})}},
           root / "core")
    return build_site(root, generated="2026-01-01")


def test_the_core_grid_heads_the_front_page_every_row_visible(tmp_path):
    pytest.importorskip("selenium")
    front = core_site(tmp_path / "site")
    browser = _driver(tmp_path)
    try:
        browser.get(front.as_uri())
        grid = browser.find_element("id", "core-grid")
        rows = grid.find_elements("css selector", "tbody tr")
        assert len(rows) == 16 and all(r.is_displayed() for r in rows)   # 15 measured, she-lora n/a throughout
        box = grid.find_element("xpath", "..")
        inner = browser.execute_script("return [arguments[0].scrollHeight, arguments[0].clientHeight];", box)
        assert inner[0] <= inner[1] + 1, f"the grid scrolls inside its box: {inner}"
        last = browser.execute_script("return arguments[0].getBoundingClientRect().bottom "
                                      "+ window.scrollY <= document.body.scrollHeight;", rows[-1])
        assert last
        names = [r.find_elements("css selector", "td")[0].text.split("\n")[0] for r in rows]
        assert names[-2].startswith("defense-07") and names[-1].startswith("she-lora")   # no utility, then n/a last
        text = grid.text
        assert "no verdict" in text and "blocked by design" in text and "of 2" in text
        legend = browser.find_element("id", "legend").text
        for symbol in ("n/a", "no verdict", "blocked by design", "not run", "no utility", "–"):
            assert symbol in legend
    finally:
        browser.quit()
    counted = walk(tmp_path / "site", tmp_path)   # every header sorts, every link resolves, the body fits
    assert counted["pages"] == 4


def test_the_summary_fits_one_screen_and_the_frontier_links_resolve(tmp_path):
    """At 1400 x 900 a track's summary (here the one table of a core suite without tracks) fits one screen; the
    frontier's SVG points are links that resolve, beside a table of the same numbers, and the page needs no script
    for them."""
    pytest.importorskip("selenium")
    from test_front_page import frontier_records

    from leaderboards.render import render
    root = tmp_path / "site"
    render(frontier_records(), {"frontier": {"undefended": ["plain"], "untrained": [], "chance": {"images": 0.1}}},
           root / "frontier")
    front = core_site(root)
    browser = _driver(tmp_path)
    try:
        browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                                {"width": 1400, "height": 900, "deviceScaleFactor": 1, "mobile": False})
        browser.get(front.as_uri())
        box = browser.execute_script("var r = document.getElementById('track0-table').getBoundingClientRect();"
                                     "return [r.width, r.height];")
        assert box[0] <= 1400 and box[1] <= 900, f"the summary takes {box} px"
        rows = browser.find_elements("css selector", "#track0-table tbody tr[data-row]")
        assert len(rows) == 16 and rows[0].find_element("css selector", "a").get_attribute("href").endswith(
            "core/index.html#core--images")
        assert "no utility" in browser.find_element("id", "track0").text.lower()   # privacy only: it says so
        points = browser.find_elements("css selector", "#frontier svg a")
        assert len(points) == 5 and all(p.get_dom_attribute("href").endswith("frontier/index.html#frontier--images")
                                        for p in points)
        assert "Pareto front" in browser.find_element("css selector", "#frontier table").text
    finally:
        browser.quit()
    assert walk(root, tmp_path)["pages"] == 5   # every link (the SVG's too) resolves, every header sorts


# Three wrong sorters, each once passed by a check that asked the page to grade itself: numbers compared as text
# (data-sort ignored), merged cells not walked (colspans ignored), and every first click worst-first.
SORT_MUTANTS = {
    "data-sort ignored": ("var raw = cell.dataset.sort;", "var raw = undefined;"),
    "colspans ignored": ("var span = row.cells[i].colSpan || 1;", "var span = 1;"),
    "data-dir flipped": ('(th.dataset.dir || "asc")', '(th.dataset.dir === "desc" ? "asc" : "desc")'),
}


@pytest.mark.parametrize("mutant", sorted(SORT_MUTANTS))
def test_the_sort_oracle_fails_a_page_whose_sorter_is_wrong(mutant, tmp_path, monkeypatch):
    """Kills the three sorter mutants: page.js with data-sort ignored, colspans ignored, or data-dir flipped, renders
    the small site whose unmutated pages pass `walk` above; re-sorted independently, its columns come out wrong."""
    pytest.importorskip("selenium")
    import leaderboards.render
    templates = tmp_path / "templates"
    shutil.copytree(leaderboards.render.TEMPLATES, templates)
    script = templates / "page.js.j2"
    old, new = SORT_MUTANTS[mutant]
    assert script.read_text().count(old) == 1, f"page.js no longer holds {old!r}: update the mutant"
    script.write_text(script.read_text().replace(old, new))
    monkeypatch.setattr(leaderboards.render, "TEMPLATES", templates)
    root = tmp_path / "site"
    small_site(root)
    browser, headers, problems = _driver(tmp_path), metric_headers(root), []
    try:
        for page in [root / "index.html", root / "vision" / "index.html"]:
            browser.get(page.resolve().as_uri())
            problems += sort_problems(browser, headers)
    finally:
        browser.quit()
    assert len([p for p in problems if "rows not sorted" in p]) >= 3, problems


# Every frontier panel's label and marker boxes as the browser lays them out, its width and its texts' sizes.
PANEL_BOXES = """
return Array.from(document.querySelectorAll('.frontier-panel svg')).map(function (svg) {
  function box(e) { var r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; }
  return {id: svg.closest('.frontier-panel').id, width: svg.getBoundingClientRect().width,
          labels: Array.from(svg.querySelectorAll('text.point-label')).map(function (t) {
            return [t.textContent, box(t)]; }),
          markers: Array.from(svg.querySelectorAll('.marker')).map(box),
          sizes: Array.from(svg.querySelectorAll('text')).map(function (t) {
            return parseFloat(getComputedStyle(t).fontSize); })};
});
"""


def _overlap(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def test_frontier_labels_never_overlap_and_text_is_at_least_12_px(tmp_path):
    """A crowded track (15 rows, most at no utility loss, 2 dB apart) and the sweep: in Chromium no two point labels'
    boxes overlap, no label lies over a marker, every text of a panel is at least 12 px and a panel at least 640 px
    wide."""
    pytest.importorskip("selenium")
    from test_front_page import frontier_records

    from leaderboards.render import render
    root = tmp_path / "site"
    render(frontier_records(), {"frontier": {"undefended": ["plain"], "untrained": [], "chance": {"images": 0.1}}},
           root / "frontier")
    front = core_site(root, tracks=[{"name": "images", "setting": "15 rows on one image scenario",
                                     "scenarios": ["images"], "utility": "images", "privacy_only": False,
                                     "central": None, "notes": {}}])
    browser = _driver(tmp_path)
    try:
        browser.get(front.as_uri())
        panels = browser.execute_script(PANEL_BOXES)
    finally:
        browser.quit()
    assert len(panels) == 2 and sum(len(p["labels"]) for p in panels) > 15   # the track's and the sweep's
    problems = []
    for p in panels:
        labels = p["labels"]
        for i, (text, box) in enumerate(labels):
            problems += [f"{p['id']}: label {text} over label {t}" for t, b in labels[i + 1:] if _overlap(box, b)]
            problems += [f"{p['id']}: label {text} over a marker" for m in p["markers"] if _overlap(box, m)]
        if min(p["sizes"]) < 12:
            problems.append(f"{p['id']}: text of {min(p['sizes'])} px")
        if p["width"] < 640:
            problems.append(f"{p['id']}: {p['width']} px wide")
    assert not problems, "\n".join(problems)
    assert not _overlap([0, 0, 10, 10], [10, 0, 20, 10]) and _overlap([0, 0, 10, 10], [9, 9, 20, 20])   # can fail
