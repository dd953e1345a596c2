"""``aiogc report``: the HTML page for run and experiment directories, escaping, errors, and a
render in headless Chromium (every figure decodes, no console output)."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from aiogc.cli import main
from aiogc.cli.report import build_report, write_report
from aiogc.config import RunConfig
from aiogc.errors import ConfigError
from aiogc.experiments import run_experiment
from aiogc.harness.local import run_live
from aiogc.harness.options import RunOptions

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--enable-logging=stderr",
                  "--v=0", "--virtual-time-budget=3000")


@pytest.fixture(scope="module")
def exp_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("matplotlib")
    d = tmp_path_factory.mktemp("exp")
    run_experiment("poly-digits", d, quick=True, seed=1)
    return d


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("matplotlib")
    d = tmp_path_factory.mktemp("run")
    cfg = RunConfig(workers=4, delta=2, n_parts=1, rounds=3, delay="exp:0.002", seed=3)
    run_live(cfg, ["partial", "original"], RunOptions(mode="coroutines", out_dir=d,
             argv=["aiogc", "run", "--rounds", "3", "<script>alert(1)</script>"]))
    return d


def test_experiment_report_embeds_figure_table_and_command(exp_dir: Path) -> None:
    page = build_report(exp_dir)
    assert page.startswith("<!DOCTYPE html>")
    assert "aiogc experiment poly-digits --out" in page
    assert page.count('src="data:image/png;base64,') == 1
    assert "<table>" in page and "digits_for_1e-6" in page
    assert "http://" not in page and "https://" not in page  # nothing fetched from anywhere


def test_run_report_escapes_directory_content(run_dir: Path) -> None:
    page = build_report(run_dir)
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert page.count('src="data:image/png;base64,') >= 2  # CDF, timeline, loss plots
    for name in ("partial", "original", "rounds.csv", "manifest.json"):
        assert name in page


def test_report_errors_name_the_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="report"):
        build_report(tmp_path / "missing")
    with pytest.raises(ConfigError, match="run directory"):
        build_report(tmp_path)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(ConfigError, match="JSON"):
        build_report(tmp_path)


def test_cli_report_writes_the_page(exp_dir: Path, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.html"
    assert main(["report", str(exp_dir), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert out.read_text().startswith("<!DOCTYPE html>")
    assert main(["report", str(tmp_path / "nope")]) == 2


# ------------------------------------------------------------------------------ Chromium


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    if os.environ.get("CI"):
        pytest.fail("headless Chromium is required in CI (.ci/run installs Debian's chromium)")
    pytest.skip("no chromium on this machine (apt-get install chromium)")


def _render(page: Path, profile: Path) -> tuple[dict[str, Any], list[str]]:
    """Load ``page`` in headless Chromium; the page's own self-check result and every console
    line Chromium logged."""
    proc = subprocess.run(
        [_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom",
         page.resolve().as_uri()],
        capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    m = re.search(r'id="aiogc-check" data-result="([^"]*)"', proc.stdout)
    assert m, "the report's self-check did not run: " + proc.stdout[-500:]
    result: dict[str, Any] = json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    console = [ln for ln in proc.stderr.splitlines() if ":CONSOLE" in ln]
    return result, console


def test_report_renders_in_headless_chromium(exp_dir: Path, run_dir: Path,
                                             tmp_path: Path) -> None:
    for i, d in enumerate((exp_dir, run_dir)):
        page = write_report(d, tmp_path / f"report{i}.html")
        result, console = _render(page, tmp_path / f"profile{i}")
        assert result["images"] >= 1
        assert result["images_ok"] == result["images"], result
        assert result["errors"] == [] and console == [], (result, console)


def test_chromium_check_catches_a_broken_figure(exp_dir: Path, tmp_path: Path) -> None:
    """Negative control: the same harness flags a figure that does not decode."""
    page = tmp_path / "broken.html"
    text = build_report(exp_dir)
    page.write_text(re.sub(r'base64,[A-Za-z0-9+/=]{64}', "base64,AAAA", text, count=1))
    result, _ = _render(page, tmp_path / "profile")
    assert result["images_ok"] < result["images"]


# ------------------------------------------------------------------------------ content


def _text(page: str) -> str:
    """The page's visible text, roughly (tags and the head's style/script removed)."""
    body = page.split("<body>", 1)[1]
    body = re.sub(r"<svg.*?</svg>", " ", body, flags=re.S)
    return html.unescape(re.sub(r"<[^>]+>", " ", body))


def test_run_report_is_shareable(run_dir: Path) -> None:
    page = build_report(run_dir)
    text = _text(page)
    # no machine paths: neither the run directory nor the home directory nor any /tmp path
    assert str(run_dir) not in page and str(run_dir.resolve()) not in page
    assert str(Path.home()) + "/" not in page
    assert "/tmp/" not in page
    # labelled tables with units and an interval; the run's end in words, no raw JSON
    assert "Per-scheme results (times in seconds" in text
    for head in ("mean round time (s)", "95% CI of the mean (s)", "median (s)",
                 "95th pct (s)", "speedup vs original (×)", "max rel. decode error"):
        assert f"<th class=\"\">{html.escape(head)}</th>" in page, head
    assert "Run ended: all rounds done" in " ".join(text.split())
    assert '{"end_reason"' not in page and "{&quot;end_reason" not in page
    # the fidelity verdict of summary.json
    summary = json.loads((run_dir / "summary.json").read_text())
    verdict = summary["fidelity"]["verdict"]
    assert f'id="fidelity-verdict">{verdict}</span>' in page
    assert "live / simulated" in text
    # a glossary; figures as inline SVG (PNG copies folded below them)
    assert "Glossary" in text and "oracle" in text and "time scale K" in text
    assert page.count("<svg") >= 2 and "Figure 1." in text
    # no test artefact in what a reader sees
    assert "Self-check" not in text and "figures loaded" not in text


def test_experiment_headline_is_a_labelled_table(exp_dir: Path) -> None:
    page = build_report(exp_dir)
    head = json.loads((exp_dir / "poly-digits.json").read_text())["headline"]
    assert "<caption>digits for 1e-6 (digits_for_1e-6)</caption>" in page
    # the "case|param=value" keys became columns, not a flattened dict
    assert "<th class=\"\">degree</th>" in page
    assert "digits_for_1e-6." not in page
    assert len(head["digits_for_1e-6"]) >= 2
    assert "/tmp/" not in page and str(exp_dir) not in page


def test_shared_report_renders_its_verdict_in_chromium(run_dir: Path, tmp_path: Path) -> None:
    """What a reader's browser shows: the verdict, the labelled summary, no failure notice."""
    page = write_report(run_dir, tmp_path / "shared.html")
    proc = subprocess.run(
        [_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
         "--dump-dom", page.resolve().as_uri()],
        capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = proc.stdout
    verdict = json.loads((run_dir / "summary.json").read_text())["fidelity"]["verdict"]
    assert f'id="fidelity-verdict">{verdict}</span>' in dom
    assert re.search(r'id="aiogc-check"[^>]* class="ok"', dom)  # passed: it stays hidden
    assert "mean round time (s)" in dom and "Glossary" in dom
    assert "/tmp/" not in dom
