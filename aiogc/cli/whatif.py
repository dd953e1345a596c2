"""``aiogc whatif RUN --no-stragglers``: the slowdown a run owes to its stragglers, apart from
the system's own overhead (:mod:`aiogc.harness.whatif`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from aiogc.errors import ConfigError


def register(sub: Any) -> None:
    p = sub.add_parser("whatif", help="counterfactual replay of a run: what if nobody "
                                      "straggled (fast simulator on its own schedule)",
                       description="Replay RUN's delays.csv with the fast simulator, as "
                                   "recorded and with every delay replaced by a typical one; "
                                   "split the live round time into work, stragglers and the "
                                   "system's overhead.")
    p.add_argument("run_dir")
    p.add_argument("--no-stragglers", action="store_true",
                   help="the counterfactual: straggler delays replaced by typical ones (required; "
                        "the only one so far)")
    p.add_argument("--baseline", choices=("worker", "cluster"), default="worker",
                   help="worker: each delay -> the typical delay of that worker (keeps "
                        "persistently slow workers slow); cluster: -> the typical delay of "
                        "all workers (default %(default)s)")
    p.add_argument("--typical", default="median", metavar="median|mean|quantile:Q",
                   help="the statistic that is the typical delay: the median, the mean or "
                        "the Q-quantile, 0 <= Q <= 1 (default %(default)s; under a skewed "
                        "law the median lies below the mean, so the median baseline also "
                        "counts that gap as stragglers)")
    p.add_argument("--json", default=None, metavar="FILE",
                   help="also write the numbers as JSON (default: RUN/whatif.json)")
    p.set_defaults(func=cmd_whatif)


def cmd_whatif(a: argparse.Namespace) -> int:
    from aiogc.harness.whatif import format_whatif, whatif_no_stragglers

    if not Path(a.run_dir).is_dir():
        raise ConfigError("run_dir", a.run_dir, "an existing run directory")
    if not a.no_stragglers:
        raise ConfigError("whatif", "(none)", "a counterfactual: --no-stragglers")
    res = whatif_no_stragglers(a.run_dir, baseline=a.baseline, typical=a.typical)
    print(format_whatif(res))
    out = Path(a.json) if a.json else Path(a.run_dir) / "whatif.json"
    clean = json.loads(json.dumps(res, default=str).replace("NaN", "null"))
    out.write_text(json.dumps(clean, indent=1) + "\n", encoding="utf-8")
    return 0
