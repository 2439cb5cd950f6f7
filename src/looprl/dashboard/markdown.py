"""A small, safe Markdown renderer for the dashboard: a run's ``report.md`` as HTML.

    html = markdown(text, image=lambda src: f"/runs/alpha/files/{src}")

Covers what looprl's reports use: headings, paragraphs, ``-``/``*``/``1.`` lists, pipe tables,
fenced code, block quotes, rules, and inline code, bold, italic, links and images.

Safety: every character of the input is HTML-escaped before any markup is added, so raw HTML in
the text (``<script>``, ``<img onerror=...>``) shows as text. Links keep only ``http(s)`` URLs
and scheme-less relative ones (no ``javascript:``/``data:``); images go through ``image``, which
maps a source to a URL the page may load, or None (the alt text is shown instead). What it does
NOT do: the full CommonMark grammar (nested lists, reference links, HTML blocks are plain text).
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable

ImageResolver = Callable[[str], str | None]

_CODE = re.compile(r"(`+)(.+?)\1")
_IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+)\)")
_LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")
_BOLD = re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*")
_EM = re.compile(r"(?<![\w*])[*_](?=\S)(.+?)(?<=\S)[*_](?![\w*])")
_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*):")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_ITEM = re.compile(r"^\s*(?:[-*+]|(\d+)[.)])\s+(.*)$")
_RULE = re.compile(r"^\s*([-*_])(\s*\1){2,}\s*$")
_TABLE_SEP = re.compile(r"^\s*\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?\s*$")

esc = html.escape


def safe_url(url: str) -> str | None:
    """``url`` if a link may point there: http(s) or relative; None for other schemes.

    >>> safe_url("https://a.b/c"), safe_url("report.md#x"), safe_url("JavaScript:alert(1)")
    ('https://a.b/c', 'report.md#x', None)
    """
    m = _SCHEME.match(url)
    if m and m.group(1).lower() not in ("http", "https"):
        return None
    return url


def inline(text: str, image: ImageResolver | None = None) -> str:
    """Inline Markdown of one line or paragraph, escaped.

    >>> inline("**gain** of `a<b` in *[docs](https://x.y)* <script>")
    '<strong>gain</strong> of <code>a&lt;b</code> in <em><a href="https://x.y">docs</a></em> &lt;script&gt;'
    """
    out: list[str] = []
    pos = 0
    for m in _CODE.finditer(text):  # code spans first: nothing inside them is markup
        out.append(_spans(text[pos:m.start()], image))
        out.append(f"<code>{esc(m.group(2).strip())}</code>")
        pos = m.end()
    out.append(_spans(text[pos:], image))
    return "".join(out)


def _spans(text: str, image: ImageResolver | None) -> str:
    s = esc(text)  # markup is added to escaped text only; captured URLs are unescaped to check

    def img(m: re.Match[str]) -> str:
        src = image(html.unescape(m.group(2))) if image else None
        if src is None:
            return f"[{m.group(1)}]"
        return f'<img alt="{m.group(1)}" src="{esc(src)}">'

    def link(m: re.Match[str]) -> str:
        url = safe_url(html.unescape(m.group(2)))
        return m.group(1) if url is None else f'<a href="{esc(url)}">{m.group(1)}</a>'

    s = _IMAGE.sub(img, s)
    s = _LINK.sub(link, s)
    s = _BOLD.sub(r"<strong>\1</strong>", s)
    return _EM.sub(r"<em>\1</em>", s)


def _cells(line: str) -> list[str]:
    line = line.strip()
    if line.startswith("|"):
        line = line[1:]
    if line.endswith("|"):
        line = line[:-1]
    return [c.strip() for c in line.split("|")]


def markdown(text: str, image: ImageResolver | None = None) -> str:
    """HTML of a Markdown document (see the module docstring for what is covered).

    >>> markdown("# T <b>\\n\\n| a | b |\\n|---|---|\\n| 1 | 2 |\\n\\n- x\\n- y")
    '<h1>T &lt;b&gt;</h1>\\n<table><tr><th>a</th><th>b</th></tr><tr><td>1</td><td>2</td></tr></table>\\n<ul><li>x</li><li>y</li></ul>'
    """
    lines = text.replace("\r\n", "\n").split("\n")
    out: list[str] = []
    para: list[str] = []
    i = 0

    def flush() -> None:
        if para:
            out.append(f"<p>{inline(' '.join(para), image)}</p>")
            para.clear()

    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if stripped.startswith("```"):
            flush()
            lang = stripped[3:].strip()
            body: list[str] = []
            i += 1
            while i < len(lines) and not lines[i].strip().startswith("```"):
                body.append(lines[i])
                i += 1
            cls = f' class="lang-{esc(lang)}"' if lang else ""
            out.append(f"<pre><code{cls}>{esc(chr(10).join(body))}</code></pre>")
            i += 1
            continue
        if not stripped:
            flush()
            i += 1
            continue
        if (h := _HEADING.match(line)) is not None:
            flush()
            n = len(h.group(1))
            out.append(f"<h{n}>{inline(h.group(2), image)}</h{n}>")
            i += 1
            continue
        if _RULE.match(line):
            flush()
            out.append("<hr>")
            i += 1
            continue
        if "|" in line and i + 1 < len(lines) and _TABLE_SEP.match(lines[i + 1]):
            flush()
            head = "".join(f"<th>{inline(c, image)}</th>" for c in _cells(line))
            rows = []
            i += 2
            while i < len(lines) and "|" in lines[i] and lines[i].strip():
                rows.append("<tr>" + "".join(f"<td>{inline(c, image)}</td>"
                                             for c in _cells(lines[i])) + "</tr>")
                i += 1
            out.append(f"<table><tr>{head}</tr>{''.join(rows)}</table>")
            continue
        if stripped.startswith(">"):
            flush()
            quote = []
            while i < len(lines) and lines[i].strip().startswith(">"):
                quote.append(lines[i].strip()[1:].lstrip())
                i += 1
            out.append(f"<blockquote>{markdown(chr(10).join(quote), image)}</blockquote>")
            continue
        if (item := _ITEM.match(line)) is not None:
            flush()
            tag = "ol" if item.group(1) else "ul"
            items = []
            while i < len(lines) and (m := _ITEM.match(lines[i])) is not None:
                items.append(f"<li>{inline(m.group(2), image)}</li>")
                i += 1
            out.append(f"<{tag}>{''.join(items)}</{tag}>")
            continue
        para.append(stripped)
        i += 1
    flush()
    return "\n".join(out)
