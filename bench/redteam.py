"""Red team: authenticated malicious workers against a live PS on loopback.

One PS and ``m`` worker coroutines over real TCP on one event loop (as ``aiogc run --as
coroutines``), with a shared secret. Worker ``--liar`` is authenticated but tampers with every
coded vector it sends, one attack class per run:

==========  ======================================================================
scale3      its true vector times 3 (the issue's "3x its true vector")
signflip    minus its true vector
replay      the vector it sent in the previous round (stale gradient)
nudge       its true vector plus 1 % of its norm in one coordinate
noise       a random vector of the same norm
huge        every entry 1e300 (the issue's blow-up)
drift:S     its true vector plus S (absolute, in gradient units) in one fixed (seeded) unit
            direction, every round: a persistent drift that each step's bounds let through,
            measured by its damage over the run (the final loss; the bench's task starts at
            a gradient norm of 3.5 and a data bound B(w0) of 3.8)
none        honest (the baseline every other class is compared with)
==========  ======================================================================

The tampering happens above the framing layer (the vector is replaced before it is encoded
and, with protocol version 2, tagged), so it is exactly what a worker holding a valid key can
do. For every applied round the bench recomputes the true gradient at the model the PS had,
from the task itself (independently of the PS's own ``--verify``), and counts the round as a
*wrong gradient applied* when the applied gradient differs from it by more than ``--tol``
relative to the uncoded gradient's summation scale. *Rounds lost* are rounds the PS did not
apply (failed or rejected) beyond the honest baseline's.

    python bench/redteam.py                        # partial and original, every attack
    python bench/redteam.py --schemes original --attacks scale3,huge --rounds 40 --json r.json

Approximate mode (``--mode approx --deadline S``): rounds decoded at the deadline are audited
against the *honest approximate estimate* (what the decoder returns from honest payloads of
the same finished chunks, ``Aggregator.honest_estimate``), since they differ from the true
gradient by design; exact rounds against the truth as before. Every approximate round is also
reported against the truth (``approx-vs-truth``, in units of ``||sum |g_i| ||``) and, without
the oracle, against the stated bound ``(1 + gain) B(w)`` of aiogc/training/approx_bound.py
(``vs-stated-bound``: must stay <= 1). ``--no-verify`` turns the PS's
oracle off (the guard keeps its norm, redundancy and model checks); ``--spare-wait F`` makes
the original scheme wait up to F times the round's elapsed time for one spare vector (the
redundancy check's cross-check). ``--locate N`` waits for two spares, locates the
liar, decodes without it and evicts it after N located rounds. The acceptance run::

    python bench/redteam.py --mode approx --deadline 0.004 --attacks none,scale3,signflip,huge,nudge
    python bench/redteam.py --schemes original --no-verify --spare-wait 1

The per-mode table in docs/security.md (exact and approximate, partial and original,
``--dtype float64`` and ``float32``; ``--repeat 3`` prints the medians of 3 runs; exact rounds
without the oracle are reported against the truth and their stated bound ``2 B(w)``)::

    python bench/redteam.py --repeat 3 --dtype D
    python bench/redteam.py --repeat 3 --no-verify --dtype D
    python bench/redteam.py --repeat 3 --schemes original --no-verify --spare-wait 1 --dtype D
    python bench/redteam.py --repeat 3 --mode approx --deadline 0.004 --dtype D
    python bench/redteam.py --repeat 3 --mode approx --deadline 0.004 --no-verify --dtype D

The run-level damage of a persistent drift (docs/security.md, "Over a run: a persistent
drift"; the final loss against the honest run's)::

    python bench/redteam.py --repeat 3 --no-verify --attacks none,drift:0.3,drift:1,drift:3
    python bench/redteam.py --repeat 3 --mode approx --deadline 0.004 --no-verify \
        --attacks none,drift:0.3,drift:1,drift:3

Liar location's (one authenticated liar at cyclic m=16, delta=4; no round lost, the liar evicted)::

    python bench/redteam.py --schemes original --workers 16 --delta 4 --spare-wait 100 \
        --locate 3 --attacks none,scale3,signflip,nudge,noise,huge

Pre-authentication attacks (garbage, oversized frames, wrong MACs, slowloris ...) are the
subject of bench/soak_socket_fuzz.py; docs/security.md reports both.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from dataclasses import replace
from typing import Any

import numpy as np

from aiogc.config import RunConfig
from aiogc.core import PSOptions, Worker
from aiogc.harness.kit import make_ps
from aiogc.net.drivers import PSServer, WorkerClient
from aiogc.protocol.messages import CodedGradient
from aiogc.training.approx_bound import decode_gain, model_sent
from aiogc.training.delays import materialise

ATTACKS = ("none", "scale3", "signflip", "replay", "nudge", "noise", "huge")


def _check_attack(attack: str) -> str:
    """``attack`` if it names a class (``drift:S`` with a finite S >= 0), else a usage error."""
    if attack in ATTACKS:
        return attack
    if attack.startswith("drift:"):
        try:
            size = float(attack[len("drift:"):])
        except ValueError:
            size = math.nan
        if math.isfinite(size) and size >= 0:
            return attack
    raise SystemExit(f"redteam: --attacks: unknown attack {attack!r}; expected one of "
                     f"{', '.join(ATTACKS)} or drift:S (S a finite number >= 0)")


class Tamper:
    """Replaces the payload of every CodedGradient a worker sends, per attack class."""

    def __init__(self, attack: str, seed: int) -> None:
        self.attack = attack
        self.rng = np.random.default_rng(seed)
        self.previous: np.ndarray | None = None
        self.sent = 0
        #: drift:S: the fixed offset (S times one seeded unit vector)
        self.offset: np.ndarray | None = None

    def payload(self, v: np.ndarray) -> np.ndarray:
        true = np.array(v, copy=True)
        a = self.attack
        if a == "scale3":
            out = 3 * true
        elif a == "signflip":
            out = -true
        elif a == "replay":
            out = self.previous if self.previous is not None else true
        elif a == "nudge":
            out = true.copy()
            out[0] += 0.01 * float(np.linalg.norm(true))
        elif a == "noise":
            r = self.rng.standard_normal(true.shape)
            out = r * (np.linalg.norm(true) / max(np.linalg.norm(r), 1e-300))
        elif a == "huge":
            out = np.full_like(true, 1e300)
        elif a.startswith("drift:"):
            if self.offset is None:
                u = self.rng.standard_normal(true.shape)
                u /= max(float(np.linalg.norm(u)), 1e-300)
                self.offset = float(a[len("drift:"):]) * u
            out = true + self.offset
        else:
            out = true
        self.previous = true
        self.sent += 1
        return np.ascontiguousarray(out, dtype=v.dtype)

    def _tamper(self, outs: Any) -> Any:
        res = []
        for o in outs:
            msg = o.message
            if isinstance(msg, CodedGradient):
                o = o._replace(message=replace(msg, payload=self.payload(msg.payload)))
            res.append(o)
        return res

    def install(self, worker: Worker) -> None:
        """Tamper with what the worker hands its driver: every ``*_and_poll`` call ends in
        ``self.poll()``, so wrapping ``poll`` (and ``messages_to_send``) sees every frame once."""
        polled = worker.poll

        def tampered_poll() -> Any:
            events, work, out, when = polled()
            return events, work, self._tamper(out), when

        sent = worker.messages_to_send

        def tampered() -> list[Any]:
            return list(self._tamper(sent()))

        worker.poll = tampered_poll  # type: ignore[method-assign]
        worker.messages_to_send = tampered  # type: ignore[method-assign]


async def _one_run(cfg: RunConfig, attack: str, liar: int, secret: bytes, *,
                   verify: bool = True, spare_wait: float = 0.0,
                   locate: int | None = None) -> dict[str, Any]:
    schedule = materialise(cfg.delay, cfg.latency, rounds=cfg.rounds, m=cfg.workers,
                           max_chunks=cfg.delta, seed=cfg.seed)
    ps, task = make_ps(cfg, schedule=schedule, verify=verify, secret=secret,
                       keep_gradients=True, locate=locate,
                       options=PSOptions(spare_wait=spare_wait,
                                         spares=2 if locate is not None else 1))
    server = PSServer(ps, host="127.0.0.1", port=0)
    serving = asyncio.create_task(server.serve())
    await server.started.wait()
    clients = []
    tamper = Tamper("none", 0)
    for j in range(cfg.workers):
        w = Worker(j, secret=secret)
        if j == liar and attack != "none":
            tamper = Tamper(attack, cfg.seed + 1)
            tamper.install(w)
        clients.append(asyncio.create_task(
            WorkerClient(w, "127.0.0.1", server.port, give_up_after_s=10).run()))
    t0 = time.perf_counter()
    await serving
    wall = time.perf_counter() - t0
    for c in clients:
        c.cancel()
    await asyncio.gather(*clients, return_exceptions=True)
    if attack != "none" and tamper.sent == 0:
        # an attack that never reached the wire would make "0 wrong gradients" meaningless
        raise RuntimeError(f"attack {attack}: the lying worker {liar} sent no tampered vector "
                           "(the tamper hook no longer sees the worker's frames)")
    return {"records": ps.records, "wall_s": wall, "ps": ps, "task": task, "tampered": tamper.sent,
            "stats": dict(dict(ps.stats))}


def _audit(cfg: RunConfig, run: dict[str, Any], tol: float) -> dict[str, Any]:
    """Replay the applied steps from the initial model and compare each with the truth."""
    task = run["task"]
    ps = run["ps"]
    scheme = ps.scheme
    w = task.initial_model().astype(np.float64)
    lr = ps.aggregator.learning_rate
    applied = wrong = approx = 0
    worst = 0.0
    # approximate rounds against the truth: in units of ||sum |g_i| || and of the stated bound
    # (1 + decode gain) * B(w) (training/approx_bound.py; only without the oracle); exact
    # rounds against the truth and, without the oracle, their stated bound 2 B(w)
    worst_truth = worst_vs_bound = worst_exact = worst_exact_vs_bound = 0.0
    agg = ps.aggregator
    dt = cfg.payload_dtype
    for rec in run["records"]:
        if rec.status == "failed" or rec.gradient is None:
            continue
        applied += 1
        # the workers computed at the model they were sent (w rounded to the payload dtype)
        w_sent = model_sent(w, dt)
        G = np.stack([task.chunk_gradient(i, w_sent) for i in range(scheme.n_chunks)])
        with np.errstate(over="ignore", invalid="ignore"):
            off = float(np.linalg.norm(rec.gradient - G.sum(axis=0)))
        off = off if math.isfinite(off) else math.inf
        absum = float(np.linalg.norm(np.abs(G).sum(axis=0))) or 1.0
        bound = agg.grad_bound_fn(w_sent) if agg.grad_bound_fn is not None else math.nan
        if rec.status == "approximate":
            # the stated bound of an approximate round: the honest estimate of what finished
            st = np.asarray(rec.state, dtype=np.int64)
            true = agg.honest_estimate(st, G, w.size)
            approx += 1
            worst_truth = max(worst_truth, off / absum)
            if agg.grad_bound_fn is not None:
                gain = decode_gain(agg.honest_estimate, st, scheme.n_chunks, scheme.n_parts)
                worst_vs_bound = max(worst_vs_bound, off / ((1 + gain) * bound))
        else:
            true = G.sum(axis=0)
            worst_exact = max(worst_exact, off / absum)
            if agg.grad_bound_fn is not None:
                worst_exact_vs_bound = max(worst_exact_vs_bound, off / (2 * bound))
        scale = float(np.linalg.norm(np.abs(G).sum(axis=0))) or 1.0
        with np.errstate(over="ignore", invalid="ignore"):
            err = float(np.linalg.norm(rec.gradient - true)) / scale
        if not math.isfinite(err) or err > tol:
            wrong += 1
        worst = max(worst, err if math.isfinite(err) else math.inf)
        with np.errstate(over="ignore", invalid="ignore"):
            w = w - lr * rec.gradient
    final = float(task.loss(w)) if np.isfinite(w).all() else math.inf
    failed = [r for r in run["records"] if r.status == "failed"]
    return {
        "rounds": len(run["records"]),
        "applied": applied,
        "approximate": approx,
        "unverified": sum(1 for r in run["records"]
                          if r.status != "failed" and r.end_detail.startswith("unverified")),
        "not_applied": len(failed),
        "wrong_applied": wrong,
        "worst_rel_error": worst,
        "worst_approx_vs_truth": worst_truth,
        "worst_approx_vs_stated_bound": worst_vs_bound,
        "worst_exact_vs_truth": worst_exact,
        "worst_exact_vs_stated_bound": worst_exact_vs_bound,
        "final_loss": final,
        "reasons": sorted({str(r.end_reason) for r in failed}),
        "located": sum("located as inconsistent" in r.end_detail for r in run["records"]),
        "evicted": sorted(run["ps"].evicted),
        "wall_s": run["wall_s"],
        "ps_stats": run["stats"],
    }


_MEDIAN_FIELDS = ("applied", "unverified", "rounds_lost", "wrong_applied", "worst_rel_error",
                  "worst_exact_vs_truth", "worst_exact_vs_stated_bound", "worst_approx_vs_truth",
                  "worst_approx_vs_stated_bound", "final_loss")


def _line(row: dict[str, Any]) -> str:
    rejected = {k[len("rejected_"):]: v for k, v in sorted(row["ps_stats"].items())
                if k.startswith("rejected_")} if "ps_stats" in row else row.get("rejected", {})
    return (f"{row['scheme']:>9} {row['attack']:>9}: applied {row['applied']:>5} (unverified "
            f"{row['unverified']:>5}) lost {row['rounds_lost']:>5} wrong-applied "
            f"{row['wrong_applied']:>5} worst-rel-err {row['worst_rel_error']:.2e} "
            f"exact-vs-truth {row['worst_exact_vs_truth']:.3f} vs-stated "
            f"{row['worst_exact_vs_stated_bound']:.3f} approx-vs-truth "
            f"{row['worst_approx_vs_truth']:.3f} vs-stated "
            f"{row['worst_approx_vs_stated_bound']:.3f} final loss {row['final_loss']:.5g} "
            f"rejected {rejected}")


def _median_row(reps: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each numeric field over repeated runs of one (scheme, attack); the
    largest stated-bound ratio of any run beside it."""
    out: dict[str, Any] = {"scheme": reps[0]["scheme"], "attack": reps[0]["attack"],
                           "repeats": len(reps)}
    for k in _MEDIAN_FIELDS:
        out[k] = float(np.median([r[k] for r in reps]))
    out["max_vs_stated_bound"] = max(max(r["worst_exact_vs_stated_bound"],
                                         r["worst_approx_vs_stated_bound"]) for r in reps)
    checks = sorted({k for r in reps for k in r["ps_stats"] if k.startswith("rejected_")})
    out["rejected"] = {k[len("rejected_"):]: float(np.median([r["ps_stats"].get(k, 0)
                                                              for r in reps]))
                       for k in checks}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--schemes", default="partial,original")
    p.add_argument("--attacks", default=",".join(ATTACKS))
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--delta", type=int, default=3)
    p.add_argument("--liar", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=("float64", "float32"), default="float64",
                   help="the payload dtype")
    p.add_argument("--tol", type=float, default=None,
                   help="relative error above which an applied gradient counts as wrong "
                        "(default max(1e-6, 1000 eps(dtype)): 1e-6 in float64, 1.2e-4 in "
                        "float32, the oracle's default tolerance)")
    p.add_argument("--mode", choices=("exact", "approx"), default="exact")
    p.add_argument("--deadline", type=float, default=0.004,
                   help="approx mode: the round deadline in seconds")
    p.add_argument("--verify", action=argparse.BooleanOptionalAction, default=True,
                   help="the PS's oracle (uncoded gradient) check")
    p.add_argument("--spare-wait", type=float, default=0.0,
                   help="original scheme: wait this multiple of the round's elapsed time for "
                        "one spare vector")
    p.add_argument("--locate", type=int, default=None, metavar="N",
                   help="original scheme: wait for two spares, locate the liar, "
                        "decode without it, evict it after N located rounds")
    p.add_argument("--repeat", type=int, default=1,
                   help="runs of each (scheme, attack); with more than 1, the medians too")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    tol = a.tol if a.tol is not None else max(1e-6, 1000 * float(np.finfo(a.dtype).eps))
    attacks = [_check_attack(x) for x in a.attacks.split(",")]
    secret = b"redteam-secret-0123456789abcdef!"
    rows: list[dict[str, Any]] = []
    medians: list[dict[str, Any]] = []
    for scheme in a.schemes.split(","):
        n_parts = 2 if scheme == "partial" else 1
        cfg = RunConfig(scheme=scheme, workers=a.workers, delta=a.delta, n_parts=n_parts,
                        rounds=a.rounds, seed=a.seed, task="linreg:samples=800,dim=16",
                        delay="exp:0.002", join_timeout_s=30.0, mode=a.mode, dtype=a.dtype,
                        deadline_s=a.deadline if a.mode == "approx" else None)
        base_lost: list[int] = []
        for attack in attacks:
            reps = []
            for k in range(a.repeat):
                run = asyncio.run(_one_run(cfg, attack, a.liar, secret, verify=a.verify,
                                           spare_wait=a.spare_wait, locate=a.locate))
                row = {"scheme": scheme, "attack": attack, "repeat": k,
                       **_audit(cfg, run, tol)}
                if attack == "none":
                    base_lost.append(row["not_applied"])
                # against the honest baseline's median (0 when none ran)
                row["rounds_lost"] = row["not_applied"] - (
                    int(np.median(base_lost)) if base_lost else 0)
                reps.append(row)
                rows.append(row)
                print(_line(row) + f" located {row['located']} evicted {row['evicted']}",
                      flush=True)
            if a.repeat > 1:
                medians.append(_median_row(reps))
    if medians:
        print(f"medians of {a.repeat} runs ({a.mode}, {a.dtype}, "
              f"{'verify' if a.verify else 'no-verify'}, spare-wait {a.spare_wait}); "
              "max-vs-stated: the largest stated-bound ratio of any run:")
        for m in medians:
            print(_line(m) + f" max-vs-stated {m['max_vs_stated_bound']:.3f}")
    total_wrong = sum(r["wrong_applied"] for r in rows)
    print(f"wrong gradients applied, all runs: {total_wrong} (tol {tol:.3g}; "
          f"python {sys.version.split()[0]}, numpy {np.__version__})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "medians": medians} if medians else rows, f, indent=2,
                      default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
