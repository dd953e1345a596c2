"""``stability`` and ``poly-digits``: numerical accuracy of the decoders.

``stability`` measures the float64 / float32 decode error vs m (original = Ye–Abbe polynomial
code at ℓ=2, partial with the frame B and with a Gaussian B) over several seeds, and writes the
worst-case condition numbers (rows with ``kind = "cond"``). Errors of very ill-conditioned
solves depend on the platform's rounding (BLAS kernels, FMA), so they are reported as ranges
(min, median, max over seeds and trials), never as one exact figure.

``poly-digits`` takes floating point out of the picture: it decodes the polynomial code's
Vandermonde system with Python's :mod:`decimal` at a chosen number of significant decimal
digits, against an exact answer (the coefficients are chosen first; the evaluations are computed
in exact rationals with :mod:`fractions`), for polynomial degrees 20, 25 and 30. Next to it, the
partial scheme's only solve, its worst ``ℓ x ℓ`` submatrix ``B_U``, is solved the same way at the
same m.
"""

from __future__ import annotations

import itertools
from decimal import Context, Decimal, localcontext
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from aiogc.coding import (
    SchemeChoices,
    cyclic_assignment,
    decoding_matrix,
    make_scheme,
    worst_condition_number,
)
from aiogc.coding.decoding_matrix import subset_conditions
from aiogc.experiments._common import (
    Experiment,
    Labels,
    Row,
    cells,
    code_rng,
    delay_seed,
    plt,
    save,
    select,
)
from aiogc.training.delays import materialise

# ------------------------------------------------------------------------------ stability

VARIANTS = (("original", "polynomial"), ("partial", "frame"), ("partial", "gaussian"))
COND_GRID = ((20, 6, 3), (40, 8, 4), (64, 8, 4), (96, 12, 6), (256, 16, 4))


def grid(quick: bool) -> dict[str, Any]:
    if quick:
        return {"ms": [8, 16, 24], "instances": 2, "trials": 4, "cond_grid": COND_GRID[:1],
                "cond_ms": [8, 16, 24]}
    return {"ms": [8, 12, 16, 20, 24, 28, 32, 40, 48], "instances": 5, "trials": 10,
            "cond_grid": COND_GRID, "cond_ms": [8, 12, 16, 20, 24, 28, 32, 40, 48]}


def _vandermonde_cond(m: int, s: int, rng: np.random.Generator, samples: int = 200) -> float:
    """Largest 2-norm condition number of the Ye–Abbe decode system (the Vandermonde matrix of
    m - s of the m points linspace(-1, 1, m)) over the full set minus the s end points, the s
    middle points and ``samples`` random straggler sets: a lower bound of the worst case."""
    a = np.linspace(-1.0, 1.0, m)
    k = m - s
    sets = [np.arange(s, m), np.setdiff1d(np.arange(m), np.arange(m // 2 - s // 2,
                                                                   m // 2 - s // 2 + s))]
    sets += [np.sort(rng.choice(m, size=k, replace=False)) for _ in range(samples)]
    mats = np.stack([np.vander(a[idx], k) for idx in sets])
    return float(subset_conditions(mats).max())


def _error_rows(m: int, g: dict[str, Any], seed: int) -> list[Row]:
    from aiogc.sim.fast import gaussian_chunk_gradients, outcomes

    delta, ell, dim = 4, 2, 120
    C, R = g["instances"], g["trials"]
    rows: list[Row] = []
    for name, dec in VARIANTS:
        errs: dict[str, list[float]] = {"float64": [], "float32": []}
        amps: list[float] = []
        for c in range(C):
            s: Any = make_scheme(name, m=m, delta=delta, n_parts=ell,
                                 choices=SchemeChoices(decoding=dec),
                                 rng=code_rng(seed, c))
            sched = materialise("exp:1.0", rounds=R, m=m, max_chunks=delta,
                                seed=delay_seed(seed, c))
            rng = np.random.default_rng([seed, m, c, 1])
            trig = outcomes(s, sched, mode="exact")[3] if name == "partial" else None
            for t in range(R):
                if trig is None:
                    state = np.asarray(s.loads).copy()
                    state[rng.choice(m, size=s.s, replace=False)] = 0  # s stragglers
                else:
                    state = trig[t]  # at the exact trigger: some chunks have exactly ℓ holders
                G64 = gaussian_chunk_gradients(delay_seed(seed, c), t, s.n_chunks, dim)
                for dtype in ("float64", "float32"):
                    G = G64.astype(dtype)
                    gsum = G.astype(np.float64).sum(axis=0)
                    V = np.zeros((m, s.payload_len(dim)), dtype=dtype)
                    for j in range(m):
                        if s.contributes(j, state):
                            V[j] = s.encode(j, state, G[s.orders[j]])
                    with np.errstate(all="ignore"):
                        res = s.decode_result(V, state, dim)
                        est = np.asarray(res.gradient, dtype=np.float64)
                        err = float(np.linalg.norm(est - gsum) / np.linalg.norm(gsum))
                    errs[dtype].append(err if np.isfinite(err) else np.inf)
                    amps.append(float(res.amplification))
        for dtype, e in errs.items():
            x = np.asarray(e)
            rows.append({"kind": "error", "m": m, "delta": delta, "ell": ell,
                         "scheme": f"{name}-{dec}", "dtype": dtype, "instances": C,
                         "trials": R, "rel_error_min": float(x.min()),
                         "rel_error_median": float(np.median(x)),
                         "rel_error_max": float(x.max()),
                         "amplification_max": float(np.max(amps))})
    return rows


def _cond_rows(g: dict[str, Any], seed: int) -> list[Row]:
    """Worst-case condition numbers: partial's B (frame, Gaussian) over the chunks' ℓ-subsets,
    min and max over B seeds; the polynomial code's Vandermonde system (lower bound)."""
    rows: list[Row] = []
    C = g["instances"]
    cells = [(m, 4, 2) for m in g["cond_ms"]] + list(g["cond_grid"])
    for m, delta, ell in cells:
        A = cyclic_assignment(m, delta)
        row: Row = {"kind": "cond", "m": m, "delta": delta, "ell": ell, "instances": C}
        for method in ("frame", "gaussian"):
            ks = [worst_condition_number(A, decoding_matrix(A, ell, method, code_rng(seed, c)),
                                         ell) for c in range(C)]
            row[f"cond_{method}_min"] = float(min(ks))
            row[f"cond_{method}_max"] = float(max(ks))
        row["cond_polynomial_lower_bound"] = _vandermonde_cond(
            m, delta - ell, np.random.default_rng([seed, m, 7]))
        rows.append(row)
    return rows


def compute(quick: bool, seed: int) -> list[Row]:
    g = grid(quick)
    rows: list[Row] = []
    tick = cells(len(g["ms"]) + 1)  # + the condition numbers
    for m in g["ms"]:
        rows += _error_rows(m, g, seed)
        tick(rows)
    rows += _cond_rows(g, seed)
    tick(rows)
    return rows


COLORS = {"original-polynomial": "C3", "partial-frame": "C0", "partial-gaussian": "C1"}


def plot(rows: list[Row], path: Path) -> None:
    p = plt()
    fig, axes = p.subplots(1, 3, figsize=(11, 3.4))
    for ax, dtype in zip(axes[:2], ("float64", "float32"), strict=True):
        for sch, color in COLORS.items():
            sel = select(rows, kind="error", scheme=sch, dtype=dtype)
            ms = [r["m"] for r in sel]
            med = [min(r["rel_error_median"], 1e3) for r in sel]
            ax.plot(ms, med, marker="o", ms=3, color=color, label=sch)
            ax.fill_between(ms, [min(r["rel_error_min"], 1e3) for r in sel],
                            [min(r["rel_error_max"], 1e3) for r in sel], color=color,
                            alpha=0.2, lw=0)
        ax.set_yscale("log")
        ax.set_xlabel("m (workers)")
        ax.set_title(f"{dtype} payloads (cyclic δ=4, ℓ=2)\nmedian, band: min-max over "
                     "seeds x trials")
        ax.legend()
    axes[0].set_ylabel("relative decode error ||ĝ-g||/||g||")
    cond = sorted(select(rows, kind="cond", delta=4, ell=2), key=lambda r: r["m"])
    ms = [r["m"] for r in cond]
    ax = axes[2]
    for key, color, label in (("frame", "C0", "partial, frame B"),
                              ("gaussian", "C1", "partial, Gaussian B")):
        ax.fill_between(ms, [r[f"cond_{key}_min"] for r in cond],
                        [r[f"cond_{key}_max"] for r in cond], color=color, alpha=0.3, lw=0)
        ax.plot(ms, [r[f"cond_{key}_max"] for r in cond], marker="o", ms=3, color=color,
                label=label)
    ax.plot(ms, [min(r["cond_polynomial_lower_bound"], 1e20) for r in cond], marker="s", ms=3,
            color="C3", label="polynomial (Vandermonde)")
    ax.set_yscale("log")
    ax.set_xlabel("m")
    ax.set_title("worst-case condition number\n(band: min-max over B seeds)")
    ax.legend()
    save(fig, path)


def summarise(rows: list[Row]) -> dict[str, Any]:
    head: dict[str, Any] = {"error": {}, "cond": {}}
    for r in select(rows, kind="error"):
        head["error"][f"{r['scheme']}|{r['dtype']}|m={r['m']}"] = [
            r["rel_error_min"], r["rel_error_median"], r["rel_error_max"]]
    for r in select(rows, kind="cond"):
        head["cond"][f"m={r['m']},delta={r['delta']},ell={r['ell']}"] = {
            "frame": [r["cond_frame_min"], r["cond_frame_max"]],
            "gaussian": [r["cond_gaussian_min"], r["cond_gaussian_max"]],
            "polynomial_lower_bound": r["cond_polynomial_lower_bound"]}
    return head


STABILITY = Experiment(
    "stability", compute, plot, summarise,
    "cyclic δ=4, ℓ=2, m ∈ {8,...,48}: decode error (float64/float32), 5 seeds x 10 trials; "
    "worst-case condition numbers of B (frame / Gaussian, min-max over 5 seeds) and of the "
    "polynomial code's Vandermonde system (quick: m ∈ {8,16,24}, 2 x 4)",
    {"error": Labels(("scheme", "dtype", "m"), ("min", "median", "max"),
                     "relative decode error")})


# ------------------------------------------------------------------------------ poly-digits


def _dec(x: Fraction, ctx: Context) -> Decimal:
    """``x`` rounded to the context's precision (the value as a decoder at that precision
    would receive it)."""
    return ctx.divide(Decimal(x.numerator), Decimal(x.denominator))


def _solve(M: list[list[Decimal]], b: list[Decimal], ctx: Context) -> list[Decimal]:
    """Gaussian elimination with partial pivoting, every operation rounded by ``ctx``."""
    n = len(b)
    A = [[*row, b[i]] for i, row in enumerate(M)]
    for k in range(n):
        p = max(range(k, n), key=lambda i: abs(A[i][k]))
        A[k], A[p] = A[p], A[k]
        if A[k][k] == 0:
            raise ZeroDivisionError("singular at this precision")
        for i in range(k + 1, n):
            f = ctx.divide(A[i][k], A[k][k])
            for j in range(k, n + 1):
                A[i][j] = ctx.subtract(A[i][j], ctx.multiply(f, A[k][j]))
    x = [Decimal(0)] * n
    for i in range(n - 1, -1, -1):
        acc = A[i][n]
        for j in range(i + 1, n):
            acc = ctx.subtract(acc, ctx.multiply(A[i][j], x[j]))
        x[i] = ctx.divide(acc, A[i][i])
    return x


def _rel_err(est: list[Decimal], true: list[Fraction]) -> float:
    num = sum((Fraction(e) - t) ** 2 for e, t in zip(est, true, strict=True))
    den = sum(t * t for t in true)
    return float((num / den) ** 0.5) if den else float("nan")


def poly_decode_error(degree: int, s: int, ell: int, digits: int, rng: np.random.Generator
                      ) -> float:
    """Relative error of the top ``ell`` coefficients of a degree-``degree`` polynomial
    recovered from ``degree + 1`` of its values at ``m = degree + 1 + s`` points
    ``linspace(-1, 1, m)`` (a random set of ``s`` stragglers), all arithmetic at ``digits``
    significant decimal digits. The Ye–Abbe decoder's gradient parts are these top coefficients.
    """
    k = degree + 1
    m = k + s
    pts = [Fraction(-1) + Fraction(2 * i, m - 1) for i in range(m)]
    used = sorted(rng.choice(m, size=k, replace=False).tolist())
    coef = [Fraction(int(v), 1000) for v in rng.integers(-1000, 1001, size=k)]  # descending
    vals = [sum(c * pts[j] ** (k - 1 - t) for t, c in enumerate(coef)) for j in used]
    ctx = Context(prec=digits)
    with localcontext(ctx):
        a = [_dec(pts[j], ctx) for j in used]
        V = [[ctx.power(x, k - 1 - t) if k - 1 - t else Decimal(1) for t in range(k)]
             for x in a]
        y = [_dec(v, ctx) for v in vals]
        try:
            est = _solve(V, y, ctx)
        except ZeroDivisionError:
            return float("inf")
    return _rel_err(est[:ell], coef[:ell])


def partial_worst_solve(m: int, delta: int, ell: int, seed: int) -> np.ndarray:
    """The partial scheme's worst ``ell x ell`` submatrix ``B_U`` (frame B, cyclic).

    Returns
    -------
    B_U : ndarray of float64, shape (ell, ell)
        The submatrix of ``B`` (columns: an ``ell``-subset of some chunk's holders) with the
        largest 2-norm condition number.
    """
    A = cyclic_assignment(m, delta)
    B = decoding_matrix(A, ell, "frame", code_rng(seed, 0))
    subs = {tuple(c) for i in range(A.shape[0])
            for c in itertools.combinations(np.flatnonzero(A[i]).tolist(), ell)}
    idx = np.array(sorted(subs))
    mats = np.transpose(B[:, idx], (1, 0, 2))
    return np.asarray(mats[int(np.argmax(subset_conditions(mats)))])


def partial_decode_error(Bu: np.ndarray, digits: int, rng: np.random.Generator) -> float:
    """Relative error of solving ``B_U x = b`` at ``digits`` digits.

    Parameters
    ----------
    Bu : ndarray, shape (n, n)
        Its float64 entries are taken as the exact rationals they are.
    digits : int
        Significant decimal digits of every operation.
    rng : numpy.random.Generator
        Draws the exact solution ``x`` (multiples of 1/1000 in [-1, 1]).

    Returns
    -------
    float
        ``||x_hat - x|| / ||x||``.
    """
    n = Bu.shape[0]
    x = [Fraction(int(v), 1000) for v in np.asarray(rng.integers(-1000, 1001, size=n)).tolist()]
    F = [[Fraction(float(Bu[i, j])) for j in range(n)] for i in range(n)]
    b = [sum((F[i][j] * x[j] for j in range(n)), Fraction(0)) for i in range(n)]
    ctx = Context(prec=digits)
    with localcontext(ctx):
        est = _solve([[_dec(v, ctx) for v in row] for row in F], [_dec(v, ctx) for v in b], ctx)
    return _rel_err(est, x)


def digits_grid(quick: bool) -> dict[str, Any]:
    if quick:
        return {"degrees": [20], "digits": [8, 16, 32], "trials": 2, "s": 2, "ell": 2}
    return {"degrees": [20, 25, 30], "digits": [8, 12, 16, 20, 24, 28, 32, 40, 48, 64],
            "trials": 100, "s": 2, "ell": 2}


def digits_compute(quick: bool, seed: int) -> list[Row]:
    g = digits_grid(quick)
    s, ell, R = g["s"], g["ell"], g["trials"]
    rows: list[Row] = []
    tick = cells(len(g["degrees"]))
    for deg in g["degrees"]:
        m = deg + 1 + s
        Bu = partial_worst_solve(m, s + ell, ell, seed)
        kappa = float(np.linalg.cond(Bu))
        for D in g["digits"]:
            for name in ("original-polynomial", "partial-frame"):
                rng = np.random.default_rng([seed, deg, D, name == "partial-frame"])
                e = np.array([poly_decode_error(deg, s, ell, D, rng) if name[0] == "o"
                              else partial_decode_error(Bu, D, rng) for _ in range(R)])
                rows.append({"degree": deg, "m": m, "s": s, "ell": ell, "digits": D,
                             "scheme": name, "trials": R, "rel_error_min": float(e.min()),
                             "rel_error_median": float(np.median(e)),
                             "rel_error_max": float(e.max()),
                             "cond": kappa if name == "partial-frame" else None})
        tick(rows)
    return rows


def digits_plot(rows: list[Row], path: Path) -> None:
    p = plt()
    fig, ax = p.subplots(figsize=(5.5, 3.6))
    degs = sorted({r["degree"] for r in rows})
    for i, deg in enumerate(degs):
        for name, ls in (("original-polynomial", "-"), ("partial-frame", ":")):
            sel = select(rows, degree=deg, scheme=name)
            d = [r["digits"] for r in sel]
            line = ax.plot(d, [max(r["rel_error_median"], 1e-70) for r in sel], ls=ls,
                           marker="o", ms=3, color=f"C{i}",
                           label=f"{'polynomial' if name[0] == 'o' else 'partial'}, "
                                 f"m={sel[0]['m']} (degree {deg})")[0]
            # an error of exactly 0 (the solve happened to be exact) has no place on a log axis
            ax.fill_between(d, [r["rel_error_min"] or r["rel_error_median"] for r in sel],
                            [min(max(r["rel_error_max"], 1e-70), 1e3) for r in sel],
                            color=line.get_color(), alpha=0.15, lw=0)
    ax.axvline(15.95, color="grey", lw=0.8, ls="--")
    ax.text(16.3, 1e-60, "float64", color="grey", fontsize=7)
    ax.set_yscale("log")
    ax.set_xlabel("working precision (significant decimal digits)")
    ax.set_ylabel("relative decode error")
    ax.set_title("Decoding error vs precision (ℓ=2, s=2; median, band min-max)")
    ax.legend()
    save(fig, path)


def digits_summarise(rows: list[Row]) -> dict[str, Any]:
    head: dict[str, Any] = {}
    for r in rows:
        head[f"{r['scheme']}|degree={r['degree']}|digits={r['digits']}"] = r["rel_error_median"]
    # digits needed for a relative error <= 1e-6 (median), per scheme and degree
    need: dict[str, Any] = {}
    for deg in sorted({r["degree"] for r in rows}):
        for name in ("original-polynomial", "partial-frame"):
            ok = [r["digits"] for r in select(rows, degree=deg, scheme=name)
                  if r["rel_error_max"] <= 1e-6]
            need[f"{name}|degree={deg}"] = min(ok) if ok else None
    return {"median_error": head, "digits_for_1e-6": need}


POLY_DIGITS = Experiment(
    "poly-digits", digits_compute, digits_plot, digits_summarise,
    "polynomial degree 20/25/30 (m = 23/28/33, s=2, ℓ=2), 8-64 significant decimal digits "
    "(decimal module; exact rationals as reference), 100 trials; partial's worst B_U at the same "
    "m (quick: degree 20, 8/16/32 digits, 2 trials)")
