"""Extra check rows of B: detecting and locating a persistent liar in exact partial mode.

**A design measured, not wired into runs.** The partial scheme's PS computes ``g^(k) = sum_j
B[k, j] v_j`` (k < ell) and has no redundancy to cross-check: no subset of its vectors decodes.
Here the decoding matrix gets ``r`` extra rows: the scheme is built with ``ell + r`` parts
(``PartialScheme(n_parts=ell + r)``, its own frame search for B~ of shape (ell + r, m)) and each
chunk gradient is padded with ``r`` zero parts, so every worker encodes with ``pinv(B~_U)``
(here B~ is the run's B with ``r`` seeded Gaussian rows below it)
and the payload length stays ``ceil(d / ell)``. An honest decode is then the gradient
followed by ``r`` parts that are exactly zero (up to rounding): the *syndrome* ``S = C V``,
``C = B~[ell:]``. A worker j that adds ``e`` to its vector makes ``S = C[:, j] e^T``:

* ``r = 1`` detects it (S != 0);
* ``r = 2`` also says who: only ``n_j``, the unit vector orthogonal to ``C[:, j]``, makes
  ``n_j^T S`` vanish (the columns of C are pairwise independent), and the round is decoded
  exactly *without* j: ``y_k = B~[k] + mu C`` with ``mu`` chosen so that ``y_k[j] = 0`` (the
  decode reads every chunk through ``lambda^T B~_U pinv(B~_U) = lambda^T``). After ``N`` located
  rounds the worker is evicted (treated as gone: the PS no longer waits for it).

The price: an exact decode needs every chunk covered ``ell + r`` times instead of ``ell`` (the
PS waits longer), and ``delta >= ell + r``. This bench measures, on the scheme's own encode and
decode, with real chunk gradients of a least-squares task along gradient descent and round
states from a delay schedule: the honest check values against their tolerance (false alarms),
per attack the detection rate, the location rate and wrong locations, evictions (right and
false), the final loss, and the mean decode time with and without the check rows. ``frame``:
two colluders make the syndrome point at an honest worker; ``r`` check rows locate at most
``r // 2`` liars (as the original scheme's spares), so at ``r = 2`` the frame holds and at
``r = 4`` it does not.

    python bench/check_rows.py                                   # m 8, delta 4, ell 2, r 2
    python bench/check_rows.py --workers 12 --delta 4 --ell 1 --checks 2 --seeds 20
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

import numpy as np

from aiogc.coding.partial import PartialScheme
from aiogc.config import RunConfig
from aiogc.training.delays import materialise
from aiogc.training.tasks import make_task

ATTACKS = ("none", "scale3", "signflip", "noise", "nudge", "drift:0.3", "frame")
#: the check's tolerance: this many times eps64 x the worst condition of a B~_U in use
SAFETY = 100.0
#: the located worker's rest check must be this many times smaller than any other's
MARGIN = 10.0


def tamper(attack: str, v: np.ndarray, rng: np.random.Generator,
           offset: np.ndarray) -> np.ndarray:
    """The liar's vector for its honest one ``v`` (shape (p,))."""
    if attack == "scale3":
        return 3 * v
    if attack == "signflip":
        return -v
    if attack == "noise":
        r = rng.standard_normal(v.shape)
        return r * (np.linalg.norm(v) / max(float(np.linalg.norm(r)), 1e-300))
    if attack == "nudge":
        out = v.copy()
        out[0] += 0.01 * float(np.linalg.norm(v))
        return out
    if attack.startswith("drift:"):
        return v + offset
    return v


def frame(V: np.ndarray, C: np.ndarray, state: np.ndarray, gone: set[int], liar: int, m: int,
          rng: np.random.Generator) -> bool:
    """Two colluders (``liar`` and the next worker) frame the one after them, H: they add
    ``alpha x`` and ``beta x`` with ``C_a alpha + C_b beta = C_H`` (exact for r = 2; least
    squares beyond), so the syndrome is ``C_H x^T``, what a lie of H alone would leave.
    False when one of the three is gone or idle this round (the frame is not attempted)."""
    a, b, h = liar, (liar + 1) % m, (liar + 2) % m
    if any(w in gone or state[w] == 0 for w in (a, b, h)):
        return False
    coef = np.linalg.lstsq(C[:, [a, b]], C[:, h], rcond=None)[0]
    x = 0.3 * float(np.linalg.norm(V[a])) * rng.standard_normal(V.shape[1])
    V[a] += coef[0] * x
    V[b] += coef[1] * x
    return True


def state_at_trigger(scheme: Any, finish: np.ndarray, gone: set[int]) -> tuple[np.ndarray, float]:
    """The first state (chunks finished per worker) at which ``scheme`` decodes exactly, and
    its time; ``finish`` (m, delta) are the chunk finish times, ``gone`` never finish."""
    m, k = finish.shape
    events = sorted((float(finish[j, c]), j) for j in range(m) for c in range(k) if j not in gone)
    state = np.zeros(m, dtype=np.int64)
    for t, j in events:
        state[j] += 1
        if scheme.is_decodable(state):
            return state.copy(), t
    raise RuntimeError("never decodable: too many workers gone for ell + r coverage")


def locate(S: np.ndarray, C: np.ndarray, used: np.ndarray, scale: float,
           tol: float) -> int | None:
    """The one worker j whose check column explains the syndrome: ``n^T S`` vanishes for
    the rows ``n`` orthogonal to ``C[:, j]`` and for no other worker's (by ``MARGIN``).

    Parameters
    ----------
    S : ndarray, shape (r, p)
        The decoded check parts.
    C : ndarray, shape (r, m)
        The check rows of B~.
    used : ndarray of int
        The contributing workers.
    scale, tol : float
        The syndrome's scale and the check's relative tolerance.
    """
    rests = []
    for j in used:
        n = np.linalg.svd(C[:, j].reshape(1, -1))[2][1:]  # (r - 1, r): n C[:, j] = 0
        rests.append((float(np.linalg.norm(n @ S)) / scale, int(j)))
    rests.sort()
    (best, j), (second, _) = rests[0], rests[1]
    return j if best <= tol and second > MARGIN * max(best, 1e-300) else None


def decode_without(Bt: np.ndarray, ell: int, V: np.ndarray, used: np.ndarray,
                   j: int) -> np.ndarray:
    """The gradient (length ``ell * p``) decoded exactly without worker ``j``: each row
    ``y_k = B~[k] + mu_k C`` with ``y_k[j] = 0`` (``lambda^T B~_U pinv(B~_U) = lambda^T``).

    Parameters
    ----------
    Bt : ndarray, shape (ell + r, m)
    ell : int
    V : ndarray, shape (m, p)
    used : ndarray of int
    j : int
    """
    C = Bt[ell:]
    cj = C[:, j]
    mu = -np.outer(Bt[:ell, j], cj) / float(cj @ cj)  # (ell, r)
    Y = Bt[:ell] + mu @ C
    keep = [i for i in used if i != j]
    return np.asarray((Y[:, keep] @ V[keep]).reshape(-1))


def run(a: argparse.Namespace, attack: str, seed: int) -> dict[str, Any]:
    ell, r, m, delta = a.ell, a.checks, a.workers, a.delta
    base = RunConfig(scheme="partial", workers=m, delta=delta, n_parts=ell, seed=seed)
    plain = base.build_scheme()
    # B~: the run's own B (its frame search) and r seeded Gaussian check rows (the frame
    # search for ell + r parts at delta = ell + r is degenerate: one part per holder)
    C0 = np.random.default_rng((seed, 7)).standard_normal((r, m))
    #: by the number of check rows in use: an eviction leaves fewer holders per chunk, so
    #: min(r, delta - ell - evicted) rows (the first ones) stay usable
    by_rows = {k: PartialScheme(plain.A, n_parts=ell + k, orders=plain.orders,
                                B=np.vstack([plain.B, C0[:k]])) for k in range(r + 1)}
    task = make_task(a.task, plain.n_chunks, seed)
    d = task.initial_model().shape[0]
    p = math.ceil(d / ell)
    sched = materialise(a.delay, "none", rounds=a.rounds, m=m, max_chunks=delta, seed=seed)
    rng = np.random.default_rng(1000 + seed)
    liar = int(rng.integers(m)) if attack != "none" else -1
    #: the lying workers (frame: the liar and the next worker)
    liars = {liar, (liar + 1) % m} if attack == "frame" else {liar}
    unit = rng.standard_normal(p)
    offset = float(attack[len("drift:"):]) * unit / np.linalg.norm(unit) \
        if attack.startswith("drift:") else np.zeros(p)
    w = task.initial_model().astype(np.float64)
    lr = task.learning_rate
    gone: set[int] = set()
    evidence: dict[int, int] = {}
    out = {"attack": attack, "seed": seed, "liar": liar, "lying_rounds": 0, "detected": 0,
           "located_right": 0, "located_wrong": 0, "rejected": 0, "false_alarms": 0,
           "evicted": [], "honest_worst_vs_tol": 0.0, "t_plain": 0.0, "t_checked": 0.0}
    for rnd in range(a.rounds):
        finish = np.cumsum(sched.compute_s[rnd, :, :delta], axis=1) + sched.network_s[rnd][:, None]
        out["t_plain"] += state_at_trigger(plain, finish, set())[1] / a.rounds
        rc = min(r, delta - ell - len(gone))
        checked = by_rows[rc]
        dpad = (ell + rc) * p
        Bt = np.asarray(checked.B, dtype=np.float64)
        C = Bt[ell:]
        state, t = state_at_trigger(checked, finish, gone)
        out["t_checked"] += t / a.rounds
        G = np.stack([task.chunk_gradient(i, w) for i in range(plain.n_chunks)])
        Gpad = np.zeros((G.shape[0], dpad))
        Gpad[:, :d] = G
        V = np.zeros((m, p))
        for j in np.flatnonzero(state > 0):
            V[j] = checked.encode(int(j), state, Gpad[checked.orders[j]])
        lying = liar >= 0 and liar not in gone and state[liar] > 0
        if lying and attack == "frame":
            lying = frame(V, C, state, gone, liar, m, rng)
        elif lying:
            V[liar] = tamper(attack, V[liar], rng, offset)
        out["lying_rounds"] += int(lying)
        res = checked.decode_result(V, state, dpad)
        assert res.exact
        S = np.asarray(res.gradient[ell * p:], dtype=np.float64).reshape(rc, p)
        used = np.flatnonzero(state > 0)
        scale = float(sum(np.linalg.norm(C[:, j]) * np.linalg.norm(V[j]) for j in used)) or 1.0
        tol = SAFETY * float(np.finfo(np.float64).eps) * max(1.0, res.amplification)
        value = float(np.linalg.norm(S)) / scale
        grad: np.ndarray | None = np.asarray(res.gradient[:d], dtype=np.float64)
        if value > tol:
            if lying:
                out["detected"] += 1
            else:
                out["false_alarms"] += 1
            grad = None
            j = locate(S, C, used, scale, tol) if rc >= 2 else None
            if j is not None:
                grad = decode_without(Bt, ell, V, used, j)[:d]
                out["located_right" if j in liars else "located_wrong"] += 1
                evidence[j] = evidence.get(j, 0) + 1
                if evidence[j] >= a.evict_after and j not in gone:
                    gone.add(j)
                    out["evicted"].append(j)
            else:
                out["rejected"] += 1
        elif not lying:
            out["honest_worst_vs_tol"] = max(out["honest_worst_vs_tol"], value / tol)
        if grad is not None:
            truth = G.sum(axis=0)
            err = float(np.linalg.norm(grad - truth)) / float(np.linalg.norm(np.abs(G).sum(0)))
            out.setdefault("wrong_applied", 0)
            out["wrong_applied"] += int(err > 1e-6)
            w = w - lr * grad
        else:
            out.setdefault("wrong_applied", 0)
    out["final_loss"] = float(task.loss(w))
    out["false_evictions"] = [j for j in out["evicted"] if j not in liars]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--delta", type=int, default=4)
    p.add_argument("--ell", type=int, default=2)
    p.add_argument("--checks", type=int, default=2,
                   help="extra check rows r (1: detect, 2: locate)")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--evict-after", type=int, default=3)
    p.add_argument("--task", default="linreg:samples=800,dim=16")
    p.add_argument("--delay", default="exp:0.05")
    p.add_argument("--attacks", default=",".join(ATTACKS))
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    if a.delta < a.ell + a.checks:
        raise SystemExit(f"check_rows: --delta {a.delta} < ell + checks = {a.ell + a.checks}: "
                         "a chunk cannot be covered ell + r times")
    rows = []
    print(f"m {a.workers}, delta {a.delta}, ell {a.ell}, check rows {a.checks}, "
          f"{a.rounds} rounds x {a.seeds} seeds, evict after {a.evict_after} located rounds")
    for attack in a.attacks.split(","):
        runs = [run(a, attack, s) for s in range(a.seeds)]
        rows.extend(runs)
        lying = sum(x["lying_rounds"] for x in runs)
        tot = a.rounds * a.seeds

        def rate(key: str, runs: list[dict[str, Any]] = runs, lying: int = lying) -> str:
            n = sum(x[key] for x in runs)
            return f"{n}/{lying}" if lying else f"{n}"

        print(f"{attack:>10}: detected {rate('detected')} located {rate('located_right')} "
              f"wrong-located {sum(x['located_wrong'] for x in runs)} rejected "
              f"{sum(x['rejected'] for x in runs)}/{tot} wrong-applied "
              f"{sum(x['wrong_applied'] for x in runs)} false-alarms "
              f"{sum(x['false_alarms'] for x in runs)}/{tot} liar-evicted "
              f"{sum(1 for x in runs if x['liar'] in x['evicted'])}/{len(runs)} "
              f"false-evictions {sum(len(x['false_evictions']) for x in runs)} "
              f"honest-worst/tol {max(x['honest_worst_vs_tol'] for x in runs):.2e} "
              f"final-loss(median) {float(np.median([x['final_loss'] for x in runs])):.5g} "
              f"decode-time ell+r/ell {float(np.mean([x['t_checked'] for x in runs])):.4f}/"
              f"{float(np.mean([x['t_plain'] for x in runs])):.4f} s", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
