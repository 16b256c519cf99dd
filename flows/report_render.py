"""Rendering a report's sections as Markdown and as an HTML page with its own styles, and the
number formats both use, so the two files always say the same thing the same way.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime

Facts = list[tuple[str, str]]
NUMERIC = re.compile(r"^[-$\d.,%]+$")


@dataclass
class Section:
    """A titled block: facts as `label: value` lines, then an optional table, then images."""

    title: str
    facts: Facts = field(default_factory=list)
    headers: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    images: list[tuple[str, str]] = field(default_factory=list)  # (file name, caption)
    note: str = ""


def render_markdown(run_id: str, header: Facts, sections: list[Section]) -> str:
    """The report as Markdown; images are linked by file name, beside the .md file."""
    lines = [f"# nightshift run `{run_id}`", ""]
    lines += [f"- **{k}:** {v}" for k, v in header] + [""]
    for sec in sections:
        lines += [f"## {sec.title}", ""]
        lines += [f"- **{k}:** {v}" for k, v in sec.facts]
        if sec.headers:
            align = ["---" if t else "---:" for t in text_columns(sec.rows, len(sec.headers))]
            lines += ["| " + " | ".join(sec.headers) + " |", "|" + "|".join(align) + "|"]
            lines += ["| " + " | ".join(row) + " |" for row in sec.rows]
        for name, cap in sec.images:
            lines += [f"![{cap}]({name})", "", f"_{cap}_", ""]
        lines += (["", f"_{sec.note}_"] if sec.note else []) + [""]
    return "\n".join(lines)


def render_html(run_id: str, header: Facts, sections: list[Section]) -> str:
    """The report as one HTML page with its own styles; images are linked by file name."""
    e = html.escape
    body = [f"<h1>nightshift run <code>{e(run_id)}</code></h1>", _facts_html(header)]
    for sec in sections:
        body.append(f"<section><h2>{e(sec.title)}</h2>")
        if sec.facts:
            body.append(_facts_html(sec.facts))
        if sec.headers:
            body.append(_table_html(sec.headers, sec.rows))
        body += [
            f'<figure><img src="{e(n)}" alt="{e(c)}"><figcaption>{e(c)}</figcaption></figure>'
            for n, c in sec.images
        ]
        if sec.note:
            body.append(f'<p class="note">{e(sec.note)}</p>')
        body.append("</section>")
    return PAGE.format(title=e(f"nightshift run {run_id}"), body="\n".join(body))


def text_columns(rows: list[list[str]], width: int) -> list[bool]:
    """Which columns hold words: those align left, numbers align right."""
    return [not all(NUMERIC.match(row[i]) for row in rows) for i in range(width)]


def _table_html(headers: list[str], rows: list[list[str]]) -> str:
    cls = [' class="text"' if t else "" for t in text_columns(rows, len(headers))]
    e = html.escape
    head = "".join(f"<th{c}>{e(h)}</th>" for c, h in zip(cls, headers, strict=True))
    body = "".join(
        "<tr>" + "".join(f"<td{c}>{e(v)}</td>" for c, v in zip(cls, row, strict=True)) + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _facts_html(facts: Facts) -> str:
    items = "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in facts)
    return f"<dl>{items}</dl>"


def num(value: float | None) -> str:
    """A rate or a latency in ms: one decimal, thousands separated, "-" when there is none."""
    return "-" if value is None else f"{value:,.1f}"


def pct(value: float | None) -> str:
    """A fraction as a whole percentage."""
    return "-" if value is None else f"{100 * value:.0f}%"


def usd(value: float | None) -> str:
    """Dollars to the hundredth of a cent: per-token prices are small."""
    return "-" if value is None else f"${value:,.4f}"


def hours(seconds: float | None) -> str:
    """A duration as `H h MM min`, or `M min SS s` under an hour."""
    if seconds is None:
        return "-"
    h, rest = divmod(int(round(seconds)), 3600)
    return f"{h} h {rest // 60:02d} min" if h else f"{rest // 60} min {rest % 60:02d} s"


def when(value: datetime | None) -> str:
    """A moment in UTC, so reports from machines in different zones agree."""
    if value is None:
        return "-"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<style>
  body {{ font: 15px/1.5 -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; color: #1f2328;
         max-width: 1040px; margin: 2rem auto; padding: 0 1.5rem; }}
  h1 {{ font-size: 1.6rem; margin-bottom: .5rem; }}
  h2 {{ font-size: 1.2rem; border-bottom: 1px solid #d0d7de; padding-bottom: .3rem; margin-top: 2rem; }}
  code {{ background: #f6f8fa; padding: .1rem .35rem; border-radius: 4px; }}
  dl {{ display: grid; grid-template-columns: max-content 1fr; gap: .2rem 1.2rem; margin: .5rem 0; }}
  dt {{ color: #57606a; }}
  dd {{ margin: 0; font-variant-numeric: tabular-nums; }}
  table {{ border-collapse: collapse; font-variant-numeric: tabular-nums; margin: .5rem 0; }}
  th, td {{ padding: .3rem .7rem; border-bottom: 1px solid #d0d7de; text-align: right; }}
  th.text, td.text {{ text-align: left; }}
  th {{ background: #f6f8fa; font-weight: 600; }}
  figure {{ margin: 1rem 0; }}
  figure img {{ max-width: 100%; border: 1px solid #d0d7de; border-radius: 6px; }}
  figcaption, .note {{ color: #57606a; font-size: .9rem; }}
</style>
</head>
<body>
{body}
</body>
</html>
"""
