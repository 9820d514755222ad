"""What a page takes from people and records, made inert before it reaches the reader's browser.

Suite notes and descriptions, a results folder's pages.json and every record field are written by
whoever ran a suite or handed over a folder; a page is opened by anyone. So nothing they hold may
become markup or a live script link:

- `notes_html`: Markdown without raw HTML (a tag in the text is shown as text), then an allow-list
  sanitizer (nh3): ordinary Markdown tags only, no event or style attributes, links only to http(s),
  an in-page anchor or a relative link to another page of the site (no scheme), each with
  rel="noopener noreferrer". The only producer of page markup from written text.
- `safe_url`: a paper or code link from a record, kept only when it is http(s) or an in-page anchor;
  anything else ("javascript:", "data:", ...) gives "" and the page shows the label as plain text.
- `site_href`: a link to a suite directory's page, its name percent-encoded so that a directory
  called "javascript:..." stays a relative path.

Everything else is plain text under Jinja's autoescape (leaderboards/render.py's env).
"""
from __future__ import annotations

import re
from urllib.parse import quote, urlsplit

import markupsafe

TAGS = {"p", "em", "strong", "code", "pre", "ul", "ol", "li", "a", "h1", "h2", "h3", "h4", "h5", "h6",
        "blockquote", "table", "thead", "tbody", "tr", "th", "td", "br", "hr"}
ATTRIBUTES = {"a": {"href", "title"}, "th": {"align"}, "td": {"align"}, "ol": {"start"}}
SCHEMES = {"http", "https"}
_STRIP = "".join(chr(c) for c in range(0x21))   # C0 controls and space: a browser drops them at both ends
_INSIDE = re.compile(r"[\t\n\r]")                 # and tabs and newlines anywhere ("java\tscript:")


def _normal(url: object) -> str:
    """The URL as a browser reads it before parsing."""
    return _INSIDE.sub("", str(url or "").strip(_STRIP))


def _scheme(url: str) -> str | None:
    """The URL's scheme in lower case, "" for a relative link, None for what cannot be read as a URL."""
    try:
        return urlsplit(url).scheme.lower()
    except ValueError:
        return None


def safe_url(url: object) -> str:
    """`url` when it is an http(s) link to a host or an in-page anchor (#...), else ""."""
    text = _normal(url)
    if text.startswith("#"):
        return text
    try:
        parts = urlsplit(text)
    except ValueError:
        return ""
    return text if parts.scheme.lower() in SCHEMES and parts.netloc else ""


def _relative(url: str) -> bool:
    """A link to another page of the site: no scheme, no host of its own, no backslash a browser reads as '/'."""
    return _scheme(url) == "" and not url.startswith("//") and "\\" not in url and ":" not in url.split("/")[0]


def _attribute(tag: str, name: str, value: str) -> str | None:
    """nh3's per-attribute hook: an href survives only as safe_url or a relative link allows it."""
    if name != "href":
        return value
    text = _normal(value)
    return (safe_url(text) or (text if _relative(text) else "")) or None


def _markdown(text: str) -> str:
    """Markdown to HTML with raw HTML switched off: a tag or block of HTML in the text is escaped as text."""
    import markdown as md

    converter = md.Markdown(extensions=["tables", "fenced_code"],
                            extension_configs={"tables": {"use_align_attribute": True}})
    converter.preprocessors.deregister("html_block")
    converter.inlinePatterns.deregister("html")
    return converter.convert(text)


def notes_html(text: object) -> markupsafe.Markup:
    """Written Markdown (suite notes) as sanitized HTML, marked safe for the templates; "" for no text."""
    import nh3

    source = str(text or "")
    if not source.strip():
        return markupsafe.Markup("")
    html = nh3.clean(_markdown(source), tags=TAGS, attributes=ATTRIBUTES, attribute_filter=_attribute,
                     url_schemes=SCHEMES, link_rel="noopener noreferrer", strip_comments=True,
                     clean_content_tags={"script", "style"})
    return markupsafe.Markup(html)


def site_href(directory: object, page: str = "index.html", fragment: str = "") -> str:
    """A link from the front page to a file of a suite directory (its name encoded: never a scheme)."""
    href = f"{quote(str(directory), safe='')}/{page}"
    return f"{href}#{fragment}" if fragment else href
