"""``aiogc report DIR``: one self-contained HTML page for a run or experiment directory.

The page embeds every figure as a ``data:`` URI, so it can be mailed or archived as one file
and opens with no network. It shows, for a **run directory** (``aiogc run --out DIR``): the
command line, the per-scheme summary table, the figures, the first rows of ``rounds.csv`` and the
full ``manifest.json``; for an **experiment directory** (``aiogc experiment NAME --out DIR``):
per experiment its command, grid, wall time, headline figures, figure and CSV. A directory can
be both. Every value from the directory is HTML-escaped.

A small inline script checks on load that every ``<img>`` decoded and that no script error
occurred, and writes the verdict into the page footer (``#aiogc-check``), so a person sees it
and a headless browser can read it back from the DOM.
"""

from __future__ import annotations

import base64
import csv
import html
import json
import re
import time
from pathlib import Path
from typing import Any

from aiogc import __version__
from aiogc.errors import ConfigError

__all__ = ["build_report", "write_report"]

#: CSV rows shown inline per table (the whole file is in the directory).
MAX_ROWS = 60

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#1d2330;
background:#f6f7f9}
header{background:#1d2330;color:#fff;padding:14px 24px}header h1{margin:0;font-size:20px}
header p{margin:4px 0 0;color:#c6ccd8;font-size:13px}
main{max-width:1100px;margin:0 auto;padding:8px 24px 40px}
section{background:#fff;border:1px solid #dde1e8;border-radius:6px;margin:18px 0;
padding:6px 18px 14px}
h2{font-size:17px;margin:12px 0 6px}h3{font-size:14px;margin:12px 0 4px}
code,pre{font:12px/1.4 ui-monospace,Menlo,Consolas,monospace;background:#f0f2f5;border-radius:4px}
code{padding:1px 4px}pre{padding:8px;overflow:auto;max-height:420px}
table{border-collapse:collapse;font-size:12px;margin:6px 0}
th,td{border:1px solid #dde1e8;padding:2px 7px;text-align:right}
th{background:#eef1f5}td.k,th.k{text-align:left}
img{max-width:100%;height:auto;border:1px solid #eee;margin:6px 0}
.muted{color:#667085;font-size:12px}details{margin:6px 0}
nav{margin:14px 0 0}nav a{margin-right:10px}
footer{max-width:1100px;margin:0 auto;padding:0 24px 30px;color:#667085;font-size:12px}
#aiogc-check.ok{color:#137333}#aiogc-check.bad{color:#b3261e;font-weight:bold}
.cut{color:#b3261e}
"""

# Runs in the page: records script errors and, on load, whether every image decoded.
_CHECK_JS = """
(function(){
  var errors=[];
  window.addEventListener('error',function(e){errors.push(String(e.message||e));});
  window.addEventListener('load',function(){
    var imgs=Array.prototype.slice.call(document.images);
    var ok=imgs.filter(function(i){return i.complete&&i.naturalWidth>0;}).length;
    var el=document.getElementById('aiogc-check');
    var res={images:imgs.length,images_ok:ok,errors:errors};
    el.setAttribute('data-result',JSON.stringify(res));
    el.className=(ok===imgs.length&&errors.length===0)?'ok':'bad';
    el.textContent=(ok===imgs.length?'all '+ok+' figures loaded':
      (imgs.length-ok)+' of '+imgs.length+' figures failed to load')+
      (errors.length?'; script errors: '+errors.join(' | '):'');
  });
})();
"""


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list) and v and all(isinstance(x, float | int) for x in v):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    return str(v)


def _img(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{data}">'


def _table(header: list[str], rows: list[list[Any]], *, first_left: bool = True) -> str:
    th = "".join(f'<th class="{"k" if first_left and i == 0 else ""}">{_e(h)}</th>'
                 for i, h in enumerate(header))
    body = "".join(
        "<tr>" + "".join(f'<td class="{"k" if first_left and i == 0 else ""}">{_e(_fmt(v))}</td>'
                         for i, v in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _csv_table(path: Path, limit: int = MAX_ROWS) -> str:
    with path.open(newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader, [])
        rows: list[list[str]] = []
        total = 0
        for r in reader:
            total += 1
            if len(rows) < limit:
                rows.append(r)
    more = (f'<p class="muted">first {limit} of {total} rows; the full file is '
            f"<code>{_e(path.name)}</code></p>") if total > limit else ""
    return _table(header, rows) + more


def _flatten(d: Any, prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    if isinstance(d, dict):
        for k, v in d.items():
            key = f"{prefix}.{k}" if prefix else str(k)
            if isinstance(v, dict):
                out += _flatten(v, key)
            else:
                out.append((key, v))
    else:
        out.append((prefix, d))
    return out


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError("report", str(path), f"a readable JSON file ({exc})") from None


# ------------------------------------------------------------------------------ sections


def _experiment_sections(d: Path) -> list[str]:
    from aiogc.experiments import EXPERIMENTS

    rank = {name: i for i, name in enumerate(EXPERIMENTS)}
    out = []
    for meta_path in sorted(d.glob("*.json"), key=lambda p: (rank.get(p.stem, 99), p.stem)):
        meta = _load_json(meta_path)
        if not isinstance(meta, dict) or "experiment" not in meta or "headline" not in meta:
            continue
        name = str(meta["experiment"])
        parts = [f'<section id="exp-{_e(name)}"><h2>Experiment: {_e(name)}</h2>',
                 f"<p><code>{_e(meta.get('command', ''))}</code></p>",
                 f"<p>{_e(meta.get('grid', ''))}</p>",
                 f'<p class="muted">seed {_e(meta.get("seed"))}, quick={_e(meta.get("quick"))},'
                 f" wall time {_e(meta.get('wall_s'))} s, Python {_e(meta.get('python'))} on "
                 f"{_e(meta.get('platform'))}</p>"]
        png = d / f"{name}.png"
        if png.is_file():
            parts.append(_img(png, f"{name} figure"))
        flat = _flatten(meta["headline"])
        parts.append("<h3>Headline figures</h3>")
        shown = flat[:80]
        parts.append(_table(["quantity", "value"], [[k, v] for k, v in shown]))
        if len(flat) > len(shown):
            parts.append(f'<p class="muted">{len(flat) - len(shown)} more in '
                         f"<code>{_e(meta_path.name)}</code></p>")
        csv_path = d / f"{name}.csv"
        if csv_path.is_file():
            parts.append(f"<details><summary>{_e(csv_path.name)}</summary>"
                         f"{_csv_table(csv_path)}</details>")
        parts.append("</section>")
        out.append("".join(parts))
    return out


_SUMMARY_COLS = (("rounds", "rounds"), ("rounds_failed", "failed"),
                 ("round_time_mean_s", "mean s"), ("round_time_p50_s", "p50 s"),
                 ("round_time_p95_s", "p95 s"), ("oracle_time_mean_s", "oracle s"),
                 ("max_rel_decode_error", "max rel err"), ("final_loss", "final loss"))


def _cut_short(d: Path) -> str | None:
    """The cut-short line of :func:`~aiogc.harness.records.run_state` (None if finished)."""
    from aiogc.harness.records import load_run, run_state

    return run_state(load_run(d))


def _summary_of_files(d: Path) -> dict[str, Any]:
    """The summary of a cut-short run, computed from the rounds its files hold."""
    from aiogc.harness.records import load_run, records_from_run, summarize

    summary = summarize(records_from_run(load_run(d)))
    summary["ok"] = False
    summary["end_reason"] = "cut short (no final summary.json)"
    return summary


def _run_sections(d: Path) -> list[str]:
    man_path = d / "manifest.json"
    if not man_path.is_file():
        return []
    man = _load_json(man_path)
    parts = ['<section id="run"><h2>Run</h2>']
    argv = man.get("argv") if isinstance(man, dict) else None
    if argv:
        parts.append(f"<p><code>{_e(' '.join(map(str, argv)))}</code></p>")
    if isinstance(man, dict):
        parts.append(f'<p class="muted">aiogc {_e(man.get("aiogc_version"))}, git '
                     f"{_e(man.get('git_sha'))}, seed {_e(man.get('seed'))}, "
                     f"mode {_e(man.get('mode'))}, loop {_e(man.get('loop'))}</p>")
    sum_path = d / "summary.json"
    summary = _load_json(sum_path) if sum_path.is_file() else None
    cut = _cut_short(d)
    if cut is not None:
        # killed (or still running): say so, and summarise the rounds on disk instead
        parts.append(f'<p class="cut"><strong>{_e(cut)}</strong></p>')
        summary = _summary_of_files(d)
    if summary is not None:
        schemes = summary.get("schemes", {}) if isinstance(summary, dict) else {}
        speed = summary.get("speedup_vs_original", {}) if isinstance(summary, dict) else {}
        # a run that ended early says why (summary field written by newer runners)
        extra = [k for k in ("end_reason",) if any(k in s for s in schemes.values())]
        rows = [[name, *[s.get(k) for k, _ in _SUMMARY_COLS], speed.get(name),
                 *[s.get(k, "") for k in extra]] for name, s in schemes.items()]
        parts.append("<h3>Summary</h3>")
        parts.append(_table(["scheme", *[h for _, h in _SUMMARY_COLS], "speedup", *extra],
                            rows))
        reasons = {k: v for k, v in summary.items() if "reason" in k} \
            if isinstance(summary, dict) else {}
        if reasons:
            parts.append(f"<p>{_e(json.dumps(reasons))}</p>")
    for png in sorted(d.glob("*.png")):
        if (d / f"{png.stem}.json").is_file():
            continue  # an experiment's figure, shown in its own section
        parts.append(f"<h3>{_e(png.name)}</h3>{_img(png, png.stem)}")
    rounds = d / "rounds.csv"
    if rounds.is_file():
        parts.append(f"<details><summary>rounds.csv</summary>{_csv_table(rounds)}</details>")
    parts.append("<details><summary>manifest.json</summary><pre>"
                 f"{_e(json.dumps(man, indent=2))}</pre></details></section>")
    return ["".join(parts)]


def build_report(directory: str | Path) -> str:
    """The HTML text of the report for ``directory``.

    Raises
    ------
    ConfigError
        ``directory`` is not a directory, or holds neither a run (``manifest.json``) nor an
        experiment (``NAME.json`` written by ``aiogc experiment``).
    """
    d = Path(directory)
    if not d.is_dir():
        raise ConfigError("report", str(directory), "an existing directory")
    sections = _run_sections(d) + _experiment_sections(d)
    if not sections:
        raise ConfigError("report", str(directory),
                          "a run directory (manifest.json) or an experiment directory "
                          "(NAME.json from aiogc experiment)")
    names = [m.group(1) for sec in sections
             for m in [re.match(r'<section id="([^"]+)"><h2>([^<]*)</h2>', sec)] if m]
    toc = "".join(f'<a href="#{n}">{_e(n.removeprefix("exp-"))}</a> ' for n in names)
    sections.insert(0, f'<nav class="muted">Contents: {toc}</nav>')
    title = f"aiogc report: {d.resolve().name}"
    made = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
        "img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'\">"
        f"<meta name=\"viewport\" content=\"width=device-width\"><title>{_e(title)}</title>"
        f"<style>{_CSS}</style><script>{_CHECK_JS}</script></head><body>"
        f"<header><h1>{_e(title)}</h1><p>{_e(str(d.resolve()))} · made {made} by aiogc "
        f"{_e(__version__)}</p></header><main>{''.join(sections)}</main>"
        '<footer>Self-check: <span id="aiogc-check">(script did not run)</span></footer>'
        "</body></html>\n")


def write_report(directory: str | Path, out: str | Path | None = None) -> Path:
    """Write the report (default ``DIRECTORY/report.html``) and return its path."""
    text = build_report(directory)
    path = Path(out) if out is not None else Path(directory) / "report.html"
    path.write_text(text, encoding="utf-8")
    return path
