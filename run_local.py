#!/usr/bin/env python3
"""Run the default live experiment on this machine (a thin script over ``aiogc run``).

With no arguments: 8 worker processes, cyclic assignment δ=3, ℓ=1, i.i.d. exponential chunk
delays (mean 20 ms), 30 rounds of least-squares regression, scheme ``partial`` then
``original`` on the same delay schedule; prints a summary table and writes the run directory
``runs/latest``. Every ``aiogc run`` flag is accepted (``python run_local.py --help``).
"""

from __future__ import annotations

import sys

from aiogc.cli import main

if __name__ == "__main__":
    raise SystemExit(main(["run", *sys.argv[1:]]))
