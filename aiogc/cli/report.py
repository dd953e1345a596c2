"""``aiogc report DIR``: one self-contained HTML page for a run or experiment directory.

The page is a report a researcher can send: one file, no network, no machine paths (every
absolute path from the directory is shortened to ``…/NAME``). For a **run directory**
(``aiogc run --out DIR``) it shows the command line, the per-scheme summary as a labelled table
(units in the headers, a 95% confidence interval of the mean round time), why the run ended,
the fidelity verdict (``summary.json``'s ``fidelity`` section: live against simulated round
times), the figures as inline SVG (redrawn from the records when matplotlib is installed; the
PNGs follow, folded, for slides), a short glossary, the first rows of ``rounds.csv`` and the
manifest. For an **experiment directory** (``aiogc experiment NAME --out DIR``): per experiment
its command, grid, wall time, headline figures (one labelled table per quantity), figure and
CSV. A directory can be both. Every value from the directory is HTML-escaped.

A small inline script checks on load that every ``<img>`` decoded and that no script error
occurred and writes the result into a hidden element (``#aiogc-check``, shown only when
something failed), which a headless browser reads back from the DOM.
"""

from __future__ import annotations

import base64
import contextlib
import csv
import html
import json
import math
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from aiogc._version import __version__
from aiogc.errors import ConfigError
from aiogc.harness.runfiles import RunFileError, read_json

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
#aiogc-check{display:none}#aiogc-check.bad{display:block;color:#b3261e;font-weight:bold}
.cut{color:#b3261e}
caption{caption-side:top;text-align:left;font-weight:600;padding:4px 0}
figure{margin:10px 0}figcaption{font-size:13px;color:#344054}
figure svg{max-width:100%;height:auto}
.verdict{font-weight:bold;padding:1px 6px;border-radius:4px}
.faithful{background:#e6f4ea;color:#137333}.unfaithful{background:#fce8e6;color:#b3261e}
dl.glossary dt{font-weight:600;margin-top:6px}dl.glossary dd{margin:0 0 0 18px}
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


#: An absolute path (two or more components): ``/home/me/runs/x`` -> ``…/x``.
_ABS_PATH = re.compile(r"(?<![\w.:/~-])/(?:[^\s/\"'<>,;]+/)+([^\s/\"'<>,;]*)")


def scrub(text: str) -> str:
    """``text`` with every absolute path shortened to ``…/LAST`` (no machine paths in a page
    meant to be shared)."""
    return _ABS_PATH.sub(lambda m: "…/" + m.group(1), text)


def _e(x: Any) -> str:
    return html.escape(scrub(str(x)), quote=True)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list) and v and all(isinstance(x, float | int) for x in v):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    return str(v)


def _img(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{data}">'


def _table(header: list[str], rows: list[list[Any]], *, first_left: bool = True,
           caption: str = "") -> str:
    cap = f"<caption>{_e(caption)}</caption>" if caption else ""
    th = "".join(f'<th class="{"k" if first_left and i == 0 else ""}">{_e(h)}</th>'
                 for i, h in enumerate(header))
    body = "".join(
        "<tr>" + "".join(f'<td class="{"k" if first_left and i == 0 else ""}">{_e(_fmt(v))}</td>'
                         for i, v in enumerate(r)) + "</tr>" for r in rows)
    return f"<table>{cap}<thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


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


def _range(lo: Any, hi: Any) -> str:
    return f"{_fmt(lo)}–{_fmt(hi)}"


def _labelled(name: str, val: dict[str, Any], lab: Any) -> str | None:
    """The table of a quantity the experiment labels (:class:`~aiogc.experiments._common.
    Labels`): the key parts as columns, a list value's entries as named columns (a CI as
    lo–hi); None when the value does not have the declared shape."""
    from aiogc.experiments._common import CI

    width = sum(2 if v == CI else 1 for v in lab.value)
    unit = f" ({lab.unit})" if lab.unit else ""
    heads = [*lab.key, *(v if v == CI else v + unit for v in lab.value)]
    rows = []
    for k, v in val.items():
        parts = str(k).split("|")
        if len(parts) != len(lab.key) or not isinstance(v, list) or len(v) != width:
            return None
        cells: list[Any] = [p.partition("=")[2] if "=" in p else p for p in parts]
        i = 0
        for col in lab.value:
            if col == CI:
                cells.append(_range(v[i], v[i + 1]))
                i += 2
            else:
                cells.append(v[i])
                i += 1
        rows.append(cells)
    return _table(heads, rows[:MAX_ROWS], caption=_quantity(name))


def _quantity(name: str) -> str:
    """A headline quantity's caption: its words, and its key when that differs."""
    words = name.replace("_", " ")
    return words if words == name else f"{words} ({name})"


def _headline(head: Any, source: str, labels: Any = None) -> str:
    """The headline as labelled tables: a quantity the experiment labels (``labels``:
    quantity -> Labels) by its declared columns; one whose value is a dict keyed
    ``case|param=value|...`` with columns case, each param, value; one quantity/value table
    for the rest (a ``..._ci`` pair shown lo–hi)."""
    out: list[str] = []
    plain: list[list[Any]] = []
    for name, val in (head.items() if isinstance(head, dict) else [("headline", head)]):
        lab = (labels or {}).get(name)
        table = _labelled(name, val, lab) if lab is not None and isinstance(val, dict) else None
        if table is not None:
            out.append(table)
            continue
        if not isinstance(val, dict) or any(isinstance(v, dict) for v in val.values()):
            plain += [[k, _range(*v) if k.endswith("_ci") and isinstance(v, list)
                       and len(v) == 2 else v] for k, v in _flatten(val, str(name))]
            continue
        keys = [str(k).split("|") for k in val]
        params = list(dict.fromkeys(p.partition("=")[0] for k in keys for p in k[1:] if "=" in p))
        rows = []
        for k, v in zip(keys, val.values(), strict=True):
            kv = dict(p.partition("=")[::2] for p in k[1:] if "=" in p)
            rows.append([k[0], *[kv.get(p, "") for p in params], v])
        out.append(_table(["case", *params, name], rows[:MAX_ROWS],
                          caption=_quantity(name)))
    if plain:
        out.append(_table(["quantity", "value"], plain[:MAX_ROWS], caption="Other quantities"))
    out.append(f'<p class="muted">from <code>{_e(source)}</code></p>')
    return "".join(out)


def _load_json(path: Path) -> Any:
    try:
        return read_json(path, kind=object)
    except RunFileError:
        raise
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
        if meta.get("interrupted"):
            parts.append(f'<p class="cut"><strong>interrupted after {_e(meta.get("cells_done"))}'
                         f" of {_e(meta.get('cells'))} cells: the table holds the finished "
                         "cells' rows; no headline, no figure</strong></p>")
        png = d / f"{name}.png"
        if png.is_file():
            parts.append(_img(png, f"{name} figure"))
        if meta["headline"] is not None:
            parts.append("<h3>Headline figures</h3>")
            exp = EXPERIMENTS.get(name)
            parts.append(_headline(meta["headline"], meta_path.name,
                                   exp.labels if exp is not None else None))
        csv_path = d / f"{name}.csv"
        if csv_path.is_file():
            parts.append(f"<details><summary>{_e(csv_path.name)}</summary>"
                         f"{_csv_table(csv_path)}</details>")
        parts.append("</section>")
        out.append("".join(parts))
    return out


#: (summary key, column header with unit) of the per-scheme summary table.
_SUMMARY_COLS = (("rounds", "rounds"), ("rounds_failed", "failed rounds"),
                 ("round_time_mean_s", "mean round time (s)"),
                 (None, "95% CI of the mean (s)"),
                 ("round_time_p50_s", "median (s)"), ("round_time_p95_s", "95th pct (s)"),
                 ("oracle_time_mean_s", "oracle mean (s)"),
                 (None, "speedup vs original (×)"),
                 ("max_rel_decode_error", "max rel. decode error"),
                 ("final_loss", "final loss"), ("end_reason", "end reason"))

_GLOSSARY = (
    ("round time", "seconds from the PS's round start to the decoded gradient (emulated "
                   "seconds at time scale K > 1)."),
    ("oracle", "the round time an ideal scheme would need given the same per-chunk delays: "
               "the lower bound the protocol is measured against."),
    ("speedup vs original", "the original gradient coding scheme's mean round time divided by "
                            "this scheme's (above 1: faster)."),
    ("95% CI of the mean", "mean ± 1.96·s/√n over the scheme's completed rounds (normal "
                           "approximation, lower end clipped at 0; rounds share one delay "
                           "schedule, so compare schemes round by round for paired "
                           "differences)."),
    ("max rel. decode error", "largest ‖decoded − true gradient‖ / ‖true gradient‖ over the "
                              "rounds (exact decoding: ~1e-16)."),
    ("straggler", "a worker whose coded vector did not arrive in time (or was dropped) in a "
                  "round; a partial straggler is one that finished only some of its chunks."),
    ("m, δ, ℓ", "workers, chunks per worker, and communication split (vectors per worker per "
                "round)."),
    ("fidelity verdict", "faithful when every scheme's live mean round time (and every "
                         "speedup) is within the threshold of the simulator's replay of the "
                         "same delay schedule; unfaithful timings measure this machine, not "
                         "the scheme."),
    ("time scale K", "time dilation: delays and timeouts times K, results in emulated seconds "
                     "(a K times faster machine)."),
)


def _ci_by_scheme(d: Path) -> dict[str, tuple[float, float]]:
    """Per scheme: the 95% normal-approximation CI of the mean round time (completed rounds)."""
    path = d / "rounds.csv"
    if not path.is_file():
        return {}
    times: dict[str, list[float]] = {}
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            try:
                t = float(row.get("duration_s") or "nan")
            except ValueError:
                continue
            if math.isfinite(t) and row.get("status") != "failed":
                times.setdefault(row.get("scheme", ""), []).append(t)
    out = {}
    for name, ts in times.items():
        if len(ts) >= 2:
            mean = statistics.fmean(ts)
            half = 1.96 * statistics.stdev(ts) / math.sqrt(len(ts))
            out[name] = (max(0.0, mean - half), mean + half)  # a time is never negative
    return out


def _summary_section(d: Path, summary: dict[str, Any]) -> str:
    schemes = summary.get("schemes") or {}
    speed = summary.get("speedup_vs_original") or {}
    ci = _ci_by_scheme(d)
    rows = []
    for name, s in schemes.items():
        row: list[Any] = [name]
        for key, head in _SUMMARY_COLS:
            if head.startswith("95% CI"):
                lo_hi = ci.get(name)
                row.append(f"{lo_hi[0]:.4g} – {lo_hi[1]:.4g}" if lo_hi else "–")
            elif head.startswith("speedup"):
                row.append(speed.get(name, "–"))
            else:
                v = s.get(key) if key else None
                row.append("–" if v is None else v)
        rows.append(row)
    parts = [_table(["scheme", *[h for _, h in _SUMMARY_COLS]], rows,
                    caption="Per-scheme results (times in seconds, emulated at time scale K)")]
    end = summary.get("end_reason")
    if end:
        stop = summary.get("interrupted_by")
        parts.append(f"<p><b>Run ended:</b> {_e(end)}"
                     + (f" (stopped by {_e(stop)})" if stop else "") + "</p>")
    return "".join(parts)


def _fidelity_section(fid: Any) -> str:
    if not isinstance(fid, dict) or not fid.get("verdict"):
        return ('<section id="fidelity"><h2>Fidelity</h2><p>No fidelity section in '
                "summary.json (a run recorded before it existed, or a remote PS).</p></section>")
    verdict = str(fid["verdict"])
    parts = ['<section id="fidelity"><h2>Fidelity</h2>',
             f'<p>Verdict: <span class="verdict {_e(verdict)}" id="fidelity-verdict">'
             f"{_e(verdict)}</span> — threshold ±{_e(_fmt(fid.get('threshold')))} on every "
             f"live/simulated ratio; time scale K = {_e(_fmt(fid.get('time_scale')))}.</p>"]
    rows = [[name, v.get("live_mean_s"), v.get("sim_mean_s"), v.get("ratio"),
             v.get("rounds_compared")] for name, v in (fid.get("schemes") or {}).items()]
    if rows:
        parts.append(_table(["scheme", "live mean round (s)", "simulated mean round (s)",
                             "live / simulated", "rounds compared"], rows,
                            caption="Live round times against the simulator's replay of the "
                                    "same schedule"))
    rows = [[name, v.get("live"), v.get("sim"), v.get("ratio")]
            for name, v in (fid.get("speedups") or {}).items()]
    if rows:
        parts.append(_table(["relative to", "live speedup (×)", "simulated speedup (×)",
                             "live / simulated"], rows, caption="Speedups of the first scheme"))
    for title, key in (("Why", "reasons"), ("Warnings", "warnings")):
        items = fid.get(key) or []
        if items:
            parts.append(f"<p><b>{title}:</b></p><ul>"
                         + "".join(f"<li>{_e(x)}</li>" for x in items) + "</ul>")
    parts.append("</section>")
    return "".join(parts)


_FIGURE_CAPTIONS = {
    "round_time_cdf": "Distribution of round times (empirical CDF, seconds)",
    "loss_vs_time": "Training loss against emulated time (seconds; wall time / time scale)",
    "timeline_round": "Timeline of a representative round: per-worker compute and upload",
}


def _caption(stem: str) -> str:
    for key, text in _FIGURE_CAPTIONS.items():
        if stem.startswith(key):
            rnd = stem.removeprefix(key)
            return f"{text} (round {rnd})" if rnd else text
    return stem


def _svg_figures(d: Path) -> list[tuple[str, str]]:
    """(stem, inline <svg>) of the run's figures, redrawn from its records; [] without
    matplotlib."""
    try:
        from aiogc.harness.plots import plot_run, plots_available
    except ImportError:  # pragma: no cover - harness always present
        return []
    if not plots_available():
        return []
    with tempfile.TemporaryDirectory() as tmp:
        out = []
        for path in plot_run(d, tmp, fmt="svg"):
            text = path.read_text(encoding="utf-8")
            out.append((path.stem, text[text.index("<svg"):]))
        return out


def _figures(d: Path) -> str:
    pngs = [p for p in sorted(d.glob("*.png")) if not (d / f"{p.stem}.json").is_file()]
    svgs = _svg_figures(d) if (d / "rounds.csv").is_file() else []
    parts = ['<section id="figures"><h2>Figures</h2>']
    for i, (stem, svg) in enumerate(svgs, start=1):
        parts.append(f"<figure>{svg}<figcaption>Figure {i}. {_e(_caption(stem))}"
                     "</figcaption></figure>")
    imgs = "".join(f"<figure>{_img(p, _caption(p.stem))}<figcaption>{_e(_caption(p.stem))} "
                   f"(<code>{_e(p.name)}</code>)</figcaption></figure>" for p in pngs)
    if svgs and imgs:
        parts.append(f"<details><summary>PNG copies (for slides)</summary>{imgs}</details>")
    elif imgs:
        parts.append(imgs)
    if len(parts) == 1:
        return ""
    return "".join(parts) + "</section>"


def _glossary() -> str:
    items = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in _GLOSSARY)
    return f'<section id="glossary"><h2>Glossary</h2><dl class="glossary">{items}</dl></section>'


def _cut_short(d: Path) -> str | None:
    """The cut-short line of :func:`~aiogc.harness.records.run_state` (None if finished)."""
    from aiogc.harness.loaders import load_run, run_state

    return run_state(load_run(d))


def _summary_of_files(d: Path) -> dict[str, Any]:
    """The summary of a cut-short run, computed from the rounds its files hold."""
    from aiogc.harness.loaders import load_run, records_from_run
    from aiogc.harness.summary import summarize

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
        parts.append(f"<p>Command: <code>{_e(' '.join(map(str, argv)))}</code></p>")
    if isinstance(man, dict):
        cfg: dict[str, Any] = man["config"] if isinstance(man.get("config"), dict) else {}
        parts.append(f'<p class="muted">aiogc {_e(man.get("aiogc_version"))}, git '
                     f"{_e(man.get('git_sha'))}, seed {_e(man.get('seed'))}, "
                     f"m = {_e(cfg.get('workers'))}, δ = {_e(cfg.get('delta'))}, "
                     f"ℓ = {_e(cfg.get('n_parts'))}, delay {_e(cfg.get('delay'))}, "
                     f"mode {_e(man.get('mode'))}, loop {_e(man.get('loop'))}</p>")
    sum_path = d / "summary.json"
    summary = _load_json(sum_path) if sum_path.is_file() else None
    cut = _cut_short(d)
    if cut is not None:
        # killed (or still running): say so, and summarise the rounds on disk instead
        parts.append(f'<p class="cut"><strong>{_e(cut)}</strong></p>')
        summary = _summary_of_files(d)
    if isinstance(summary, dict):
        parts.append(_summary_section(d, summary))
    rounds = d / "rounds.csv"
    if rounds.is_file():
        parts.append(f"<details><summary>rounds.csv (first rows)</summary>{_csv_table(rounds)}"
                     "</details>")
    parts.append("<details><summary>manifest.json</summary><pre>"
                 f"{_e(json.dumps(man, indent=2))}</pre></details></section>")
    out = ["".join(parts)]
    if isinstance(summary, dict):
        out.append(_fidelity_section(summary.get("fidelity")))
    figs = _figures(d)
    if figs:
        out.append(figs)
    out.append(_glossary())
    return out


#: results.csv columns the sweep page shows after the grid keys (label, unit).
_SWEEP_COLS = (("rounds", "rounds", ""), ("rounds_failed", "failed", ""),
               ("round_time_mean_s", "mean round", "s"), ("round_time_p95_s", "p95 round", "s"),
               ("speedup_vs_original", "speedup vs original", "x"),
               ("fidelity", "fidelity", ""), ("end_reason", "end reason", ""))


def _is_sweep(d: Path) -> bool:
    return (d / "results.csv").is_file() and (d / "sweep.toml").is_file()


def _sweep_sections(d: Path) -> list[str]:
    """A sweep directory (``aiogc sweep``): one table, a row per cell and scheme, the mean
    round time with its 95% CI (from the cell's rounds.csv) and a link to the cell's page."""
    if not _is_sweep(d):
        return []
    from urllib.parse import quote

    with (d / "results.csv").open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        header = list(reader.fieldnames or [])
        rows = list(reader)
    fixed = {"cell", "scheme", "run_dir", *(c for c, _, _ in _SWEEP_COLS)}
    grid = [c for c in header if c not in fixed and header.index(c) < header.index("scheme")]
    heads = ["cell", *grid, "scheme", "mean round time, 95% CI (s)",
             *(f"{label} ({unit})" if unit else label for _, label, unit in _SWEEP_COLS)]
    cis: dict[str, dict[str, tuple[float, float]]] = {}
    body = []
    for r in rows:
        cell = r.get("cell", "")
        if cell not in cis:
            cis[cell] = _ci_by_scheme(d / cell)
        ci = cis[cell].get(r.get("scheme", ""))
        link = (f'<a href="{_e(quote(cell))}/report.html">{_e(cell)}</a>'
                if (d / cell / "manifest.json").is_file() else _e(cell))
        cells = [link, *(_e(r.get(g, "")) for g in grid), _e(r.get("scheme", "")),
                 _e(f"{float(ci[0]):.4g}–{float(ci[1]):.4g}") if ci else "-"]
        for col, _, _ in _SWEEP_COLS:
            v = r.get(col, "")
            if col not in ("fidelity", "end_reason") and v:
                with contextlib.suppress(ValueError):
                    v = _fmt(float(v))
            cells.append(_e(v or "-"))
        body.append("<tr>" + "".join(f'<td class="{"k" if i == 0 else ""}">{c}</td>'
                                     for i, c in enumerate(cells)) + "</tr>")
    th = "".join(f"<th>{_e(h)}</th>" for h in heads)
    table = (f"<table><caption>results.csv: one row per cell and scheme; each cell links to "
             f"its own report</caption><thead><tr>{th}</tr></thead>"
             f"<tbody>{''.join(body)}</tbody></table>")
    toml = (d / "sweep.toml").read_text(encoding="utf-8")
    return [f'<section id="sweep"><h2>Sweep</h2><p>{len(cis)} cell(s), {len(rows)} row(s).'
            f"</p>{table}<details><summary>sweep.toml</summary><pre>{_e(toml)}</pre></details>"
            "</section>"]


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
    sections = _run_sections(d) + _experiment_sections(d) + _sweep_sections(d)
    if not sections:
        raise ConfigError("report", str(directory),
                          "a run directory (manifest.json), an experiment directory "
                          "(NAME.json from aiogc experiment) or a sweep directory "
                          "(results.csv and sweep.toml from aiogc sweep)")
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
        f"<header><h1>{_e(title)}</h1><p>made {made} by aiogc {_e(__version__)}</p></header>"
        f"<main>{''.join(sections)}</main>"
        '<footer><span id="aiogc-check">(the page check did not run)</span></footer>'
        "</body></html>\n")


def write_report(directory: str | Path, out: str | Path | None = None) -> Path:
    """Write the report (default ``DIRECTORY/report.html``) and return its path. For a sweep
    directory, each cell's page is written too (``CELL/report.html``, which the sweep page
    links to)."""
    d = Path(directory)
    if d.is_dir() and _is_sweep(d):
        for cell in sorted(p for p in d.iterdir() if (p / "manifest.json").is_file()):
            write_report(cell)
    text = build_report(directory)
    path = Path(out) if out is not None else Path(directory) / "report.html"
    path.write_text(text, encoding="utf-8")
    return path
