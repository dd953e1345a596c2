"""aiogc from Python, as in a notebook: simulate, run live, load the run back, sweep.

Each ``# %%`` block is one notebook cell (VS Code, Jupytext and PyCharm open the file as a
notebook; ``jupytext --to notebook examples/notebook.py`` writes an ``.ipynb``). As a script::

    python examples/notebook.py               # the full sizes below, into runs/<timestamp>
    python examples/notebook.py --small --out DIR   # seconds; what the test suite runs

The keyword arguments are ``aiogc run`` / ``aiogc simulate`` flags with ``_`` for ``-``, with
the same defaults (``aiogc run --help``).
"""

# %%
from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import aiogc

cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
cli.add_argument("--small", action="store_true", help="tiny sizes (seconds)")
cli.add_argument("--out", default=None, help="where the runs go (default runs/<timestamp>)")
opts, _ = cli.parse_known_args()  # a notebook kernel passes its own arguments
SMALL = opts.small
OUT = Path(opts.out) if opts.out else None

# %% [markdown]
# ## Simulate: the completion time of one round, partial vs original gradient coding

# %%
sim = aiogc.simulate(workers=8, delta=3, delay="exp:0.02", schemes=["partial", "original"],
                     rounds=50 if SMALL else 2000, seed=1)
print(sim.to_pandas()[["scheme", "completion_mean", "completion_std", "exact_fraction"]])
print(f"simulated speedup (original / partial): {sim.speedup:.3f}")

# %% [markdown]
# ## Run it live: a parameter server and 8 workers over loopback TCP

# %%
live_knobs = dict(workers=8, delta=3, delay="exp:0.02", schemes=["partial", "original"],
                  rounds=3 if SMALL else 30, seed=1, task="linreg:samples=400,dim=10",
                  as_="coroutines" if SMALL else "processes", plots=not SMALL)
run = aiogc.run(**live_knobs, out=None if OUT is None else OUT / "run")
rounds = run.to_pandas()
print(rounds.groupby("scheme")["duration_s"].describe()[["count", "mean", "50%"]])
print(f"run directory: {run.dir} ({run.end_reason})")

# %%
again = aiogc.load_run(run.dir)  # the files on disk agree with what run() returned
assert again.summary == run.summary
assert len(again.rounds) == len(rounds)

# %% [markdown]
# ## Inside a running event loop (a notebook's), ``await`` the async variant


# %%
async def in_a_loop() -> aiogc.RunResult:
    return await aiogc.run_async(**{**live_knobs, "rounds": 2},
                                 out=None if OUT is None else OUT / "async")


print(asyncio.run(in_a_loop()).end_reason)

# %% [markdown]
# ## A sweep: every combination of the grid is one run; complete cells are skipped on re-run

# %%
grid = {"workers": [6, 8], "delay": ["exp:0.002", "straggle:0.25,5,exp:0.002"]}
sweep = aiogc.sweep(grid if not SMALL else {"workers": [4], "delay": ["exp:0.002"]},
                    delta=2, rounds=2 if SMALL else 20, as_="coroutines", plots=False,
                    task="linreg:samples=400,dim=10",
                    out=None if OUT is None else OUT / "sweep")
print(sweep.to_pandas()[["cell", "scheme", "round_time_mean_s", "speedup_vs_original"]])
