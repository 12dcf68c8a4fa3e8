"""The report's HTML page: one file with its pictures inlined. Pure."""

from __future__ import annotations

import base64
import html
import math
from typing import List, Tuple

from hvdkeras.report.run_data import RunData


def _fmt(value) -> str:
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.4g}"
    return html.escape(str(value))


def _facts(run: RunData) -> List[Tuple[str, str]]:
    s = run.summary
    facts = [("run directory", str(run.directory)), ("history from", run.source),
             ("epochs in the history", f"{run.epochs[0]}-{run.epochs[-1]}" if run.epochs else "none")]
    for key, label in (("name", "recipe"), ("ranks", "ranks"), ("global_batch", "global batch"),
                       ("steps_per_epoch", "steps per epoch"), ("fit_seconds", "seconds in fit"),
                       ("examples_per_second", "examples / s (all ranks)")):
        if s.get(key) is not None:
            facts.append((label, _fmt(float(s[key]) if key in ("fit_seconds", "examples_per_second")
                                      else s[key])))
    return facts


def render(run: RunData, pictures: List[Tuple[str, str, bytes]]) -> str:
    """The page: facts, then each (file name, caption, PNG bytes), then the
    history as a table."""
    title = f"hvdkeras run: {run.summary.get('name') or run.directory.name}"
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
             "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}"
             "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;"
             "padding:3px 8px;text-align:right}th{background:#f3f3f3}figure{margin:1.5em 0}"
             "figcaption{color:#555;font-size:14px}img{max-width:100%}</style></head><body>",
             f"<h1>{html.escape(title)}</h1><table>"]
    parts += [f"<tr><th>{html.escape(k)}</th><td style='text-align:left'>{v}</td></tr>"
              for k, v in _facts(run)]
    parts.append("</table>")
    for name, caption, png in pictures:
        data = base64.b64encode(png).decode()
        parts.append(f"<figure><img alt='{html.escape(name)}' src='data:image/png;base64,{data}'>"
                     f"<figcaption>{html.escape(caption)} ({html.escape(name)})</figcaption></figure>")
    columns = list(run.history)
    parts.append("<h2>History</h2><table><tr><th>epoch</th>"
                 + "".join(f"<th>{html.escape(c)}</th>" for c in columns) + "</tr>")
    for i, epoch in enumerate(run.epochs):
        parts.append(f"<tr><td>{epoch}</td>"
                     + "".join(f"<td>{_fmt(run.history[c][i])}</td>" for c in columns) + "</tr>")
    parts.append("</table></body></html>\n")
    return "\n".join(parts)
