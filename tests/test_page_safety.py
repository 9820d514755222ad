"""Pages stay inert whatever a suite's notes, a pages.json or a record says: written text and record fields
never become a script, an event handler or a javascript: link, while ordinary Markdown still renders."""
import json
import re
from html.parser import HTMLParser

import pytest

from bench.cli import main
from bench.protocol.records import seal
from bench.registry import METRICS
from tests.conftest import consistent
from leaderboards.render import env, render
from leaderboards.safe import notes_html, safe_url, site_href

SCRIPT = "</script><script>alert(1)</script>"
IMG = '"><img src=x onerror=alert(1)>'
NOTES = f"""Benign: a **bold** word, a [paper](https://example.org/paper) and [the notes](#t--notes).

| metric | value |
|---|---|
| psnr | 30 |

Hostile: <script>alert('notes')</script> <img src=x onerror=alert(2)> <a href="javascript:alert(3)">raw</a>
[md link](javascript:alert(4)) [spaced]( JaVaScRiPt:alert(5)) [data](data:text/html;base64,PHNjcmlwdD4=)
{SCRIPT}

<div onclick="alert(6)">a block of HTML</div>
"""
DESCRIPTION = f"<script>alert('description')</script>{IMG} [x](javascript:alert(7))"
SOURCES = {"defense": {"about": SCRIPT, "paper": "javascript:alert(8)", "code": " JaVaScRiPt:alert(9)"},
           "attack": {"about": IMG, "paper": "data:text/html,<script>alert(10)</script>",
                      "code": "https://github.com/example/attack"}}
DANGEROUS = ("javascript:", "vbscript:", "data:")


def record(defense, attack, scenario, status="ok", reason="", suite="t", **metrics):
    """A sealed record (so a page shows it in its tables, bench/protocol/records.py) whose every field is hostile."""
    return seal({"cell_id": f"{scenario}-{defense}-{attack}", "suite": suite, "scenario": scenario, "defense": defense,
                 "defense_params": {"note": SCRIPT}, "attack": attack, "attack_params": {}, "status": status,
                 "reason": reason, "metrics": metrics, "environment": {},
                 "details": {"per_target": {}, "family": "image", "sources": SOURCES,
                             "texts": [{"reference": [SCRIPT, IMG], "recovered": [IMG, SCRIPT]}],
                             "metric_schema": {m: METRICS.get(m).snapshot() for m in metrics}}})


def hostile_records(suite="t"):
    scenario = f"s{IMG}"
    return [record("plain", "idlg", scenario, suite=suite, psnr=30.0, upload_bytes=10.0, accuracy=0.9),
            record(f"evil{IMG}", f"atk{IMG}", scenario, suite=suite, psnr=12.0, upload_bytes=20.0, accuracy=0.8),
            record("broken", "idlg", scenario, "failed", f"RuntimeError: {SCRIPT}", suite=suite, accuracy=0.7)]


class Page(HTMLParser):
    """Every element's attributes and every script block's text, as a browser would parse them."""

    def __init__(self, html: str):
        super().__init__(convert_charrefs=True)
        self.attrs: list[tuple[str, str, str]] = []
        self.scripts: list[str] = []
        self._in_script = False
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        self.attrs += [(tag, name, value or "") for name, value in attrs]
        if tag == "script":
            self._in_script = True
            self.scripts.append("")

    def handle_endtag(self, tag):
        if tag == "script":
            self._in_script = False

    def handle_data(self, data):
        if self._in_script:
            self.scripts[-1] += data


def assert_inert(html: str):
    own = env().get_template("page.js.j2").render().strip()
    page = Page(html)
    assert len(re.findall(r"<script", html, flags=re.I)) == 1, "a <script> beside the page's own"
    assert [s.strip() for s in page.scripts] == [own]
    handlers = [(t, n) for t, n, _ in page.attrs if re.fullmatch(r"on\w+", n)]
    assert not handlers, f"event-handler attributes: {handlers}"
    for tag, name, value in page.attrs:
        if name in ("href", "src", "action", "formaction"):
            text = re.sub(r"[\x00-\x20]", "", value).lower()
            if tag == "img" and text.startswith("data:image/png;base64,"):
                continue
            assert not text.startswith(DANGEROUS), f"<{tag} {name}={value!r}>"


def test_hostile_notes_description_names_and_record_links_render_inert(tmp_path):
    info = {"t": {"notes": NOTES, "description": DESCRIPTION, "paper": [
        {"metric": "psnr", "reported": 40.0, "source": IMG, "defense": "plain", "note": SCRIPT}]}}
    html = render(hostile_records(), info, tmp_path / "t").read_text()
    assert_inert(html)
    notes = html[html.index('id="t--notes"'):]
    assert "<strong>bold</strong>" in notes and "<table>" in notes and "<td>psnr</td>" in notes
    assert '<a href="https://example.org/paper" rel="noopener noreferrer">paper</a>' in notes
    assert '<a href="#t--notes" rel="noopener noreferrer">the notes</a>' in notes
    assert "&lt;script&gt;alert('notes')&lt;/script&gt;" in notes       # shown as text, not run
    assert '<a href="https://github.com/example/attack" rel="noopener noreferrer">code</a>' in html
    assert '<span class="links">[paper · code]</span>' in html          # the javascript: links as plain text
    assert "&lt;script&gt;alert(&#39;description&#39;)&lt;/script&gt;" in html


def test_site_over_a_hostile_pages_json_and_directory_name_renders_inert(tmp_path):
    for name in ("t", "javascript:alert(11)"):   # records read back are checked: their suite and scenario are
        suite = "t" if name == "t" else "u"         # file names, so the hostile text rides in every other field
        records = [consistent({**r, "scenario": "s"}) for r in hostile_records(suite)]
        render(records, {suite: {}}, tmp_path / name)
        (tmp_path / name / "pages.json").write_text(json.dumps({suite: {"notes": NOTES, "description": DESCRIPTION}}))
    assert main(["site", str(tmp_path), "--date", "2026-01-01"]) == 0
    front = (tmp_path / "index.html").read_text()
    assert_inert(front)
    assert 'href="javascript%3Aalert%2811%29/index.html"' in front and 'href="t/index.html"' in front
    page = (tmp_path / "t" / "index.html").read_text()
    assert_inert(page)
    assert "<strong>bold</strong>" in page and "<table>" in page


@pytest.mark.parametrize("url,kept", [
    ("https://arxiv.org/abs/2001.02610", True), ("http://example.org/x?a=1#b", True), ("#t--notes", True),
    ("javascript:alert(1)", False), (" JaVaScRiPt:alert(1)", False), ("java\tscript:alert(1)", False),
    ("\x01javascript:alert(1)", False), ("data:text/html,x", False), ("vbscript:x", False), ("https:evil", False),
    ("//evil.example", False), ("relative/page.html", False), ("", False), (None, False)])
def test_safe_url_keeps_only_http_links_and_anchors(url, kept):
    assert bool(safe_url(url)) is kept


def test_notes_keep_relative_site_links_and_drop_raw_html():
    html = notes_html("[mia](../mia/index.html#mia--s) <b onmouseover=x>b</b> ```<script>``` [p](//evil.example)")
    assert 'href="../mia/index.html#mia--s"' in html and "&lt;b onmouseover=x&gt;" in html
    assert "<script" not in html and 'href="//evil.example"' not in html
    assert notes_html("") == "" and notes_html(None) == ""
    assert site_href("javascript:alert(1)", fragment="a--b") == "javascript%3Aalert%281%29/index.html#a--b"


def test_a_hostile_frontier_suite_renders_inert(tmp_path):
    """The frontier's inline SVG carries record names in tooltips and labels, and links built from a folder name."""
    name = "javascript:alert(12)"
    evil = record(f"evil{IMG}", "idlg", "s", suite="frontier", psnr=12.0, accuracy=0.8, he_encrypt_s=1.0)
    hostile = hostile_records("frontier") + [evil]
    hostile[0]["details"]["undefended"] = True   # the plain row, as its record says
    records = [consistent({**r, "scenario": "s"}) for r in hostile]
    render(records, {"frontier": {}}, tmp_path / name)
    (tmp_path / name / "pages.json").write_text(json.dumps({"frontier": {"notes": NOTES}}))
    assert main(["site", str(tmp_path), "--date", "2026-01-01"]) == 0
    front = (tmp_path / "index.html").read_text()
    assert_inert(front)
    section = front[front.index('id="frontier"'):front.index('id="board"')]
    assert "<svg" in section and 'href="javascript%3Aalert%2812%29/index.html#frontier--s"' in section
    assert "<script" not in section and "&lt;script&gt;" in section
