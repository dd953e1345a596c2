#!/usr/bin/env python3
"""Run the default live experiment on this machine (a thin script over ``aiogc run``).

With no arguments: 8 worker processes, cyclic assignment δ=3, ℓ=1, i.i.d. exponential chunk
delays (mean 20 ms), 30 rounds of least-squares regression, scheme ``partial`` then
``original`` on the same delay schedule; prints a summary table and writes a new run directory
``runs/<UTC timestamp>`` (``runs/latest`` points at it). Every ``aiogc run`` flag is accepted
(``python run_local.py --help``).

Unless ``--time-scale`` is given, it runs with ``--time-scale auto``: a short calibration picks
the smallest time dilation K that keeps this machine's overhead within the fidelity threshold,
so the default run's round times and speedup are the protocol's, not Python's (the summary's
``fidelity`` lines say how close the run came).
"""

from __future__ import annotations

import sys

from aiogc.cli import main

if __name__ == "__main__":
    args = sys.argv[1:]
    if not any(a == "--time-scale" or a.startswith("--time-scale=") for a in args):
        args = ["--time-scale", "auto", *args]
    raise SystemExit(main(["run", *args]))
