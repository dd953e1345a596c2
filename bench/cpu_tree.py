"""aiogc's CPU per partial round for whichever ``aiogc`` is importable: compare two trees with
``OPENBLAS_NUM_THREADS=1 PYTHONPATH=TREE python bench/cpu_tree.py`` (TREE holding an ``aiogc/``
package, e.g. ``git archive REV aiogc | tar -x -C TREE``), interleaving the trees.

m=64, delta 4, exp:0.01, coroutines, verify on, no plots: ``bench_fidelity._cpu_per_round``
of ``run_live`` (the difference of a 20- and a 4-round run after a warm-up), the same
measurement as the ``loop_cpu_vs_*`` records.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_fidelity import _cpu_per_round

import aiogc
from aiogc.config import RunConfig
from aiogc.harness.local import run_live
from aiogc.harness.options import RunOptions


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=64)
    ap.add_argument("--rounds", type=int, nargs=2, default=(4, 20), metavar=("SHORT", "LONG"),
                    help="the two runs whose CPU difference is measured (default 4 20); "
                         "longer runs average more rounds")
    a = ap.parse_args(argv)
    short, long = a.rounds
    if not 1 <= short < long:
        ap.error(f"--rounds: SHORT >= 1 and LONG > SHORT, got {short} {long}")

    def run(n: int) -> None:
        cfg = RunConfig(workers=a.workers, delta=4, n_parts=1, delay="exp:0.01", rounds=n,
                        seed=1)
        run_live(cfg, ["partial"], RunOptions(mode="coroutines", plots=False))

    print(f"{Path(aiogc.__file__).parent} {1e3 * _cpu_per_round(run, short, long):.2f} ms/round")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
