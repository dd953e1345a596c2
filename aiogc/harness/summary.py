"""Per-scheme statistics of a run (``summary.json``): round times, losses, decode errors,
speed-ups, end reasons; strict JSON (``None`` where undefined, never NaN).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from aiogc.core.common import RoundRecord
from aiogc.harness.columns import to_jsonable

__all__ = ["MAX_LISTED_FAILED_ROUNDS", "summarize"]


def _finite(xs: Iterable[float | None]) -> list[float]:
    return [float(x) for x in xs if x is not None and math.isfinite(float(x))]


def _opt(x: float | None) -> float | None:
    return float(x) if x is not None and math.isfinite(float(x)) else None


#: Failed rounds listed by name in a summary at most (the count is always complete).
MAX_LISTED_FAILED_ROUNDS = 100


def _nonfinite_failure(recs: Sequence[RoundRecord]) -> tuple[int, str] | None:
    """The first round whose loss or decode error says the model was broken, with why.

    An infinite loss or decode error fails wherever it occurs. A NaN loss fails in a round that
    applied a step, once the run records losses at all (a run without a loss function has NaN
    everywhere); a NaN decode error only means the round was not verified.
    """
    losses_recorded = any(r.loss is not None and math.isfinite(r.loss) for r in recs)
    for r in recs:
        loss = float("nan") if r.loss is None else float(r.loss)
        if math.isinf(loss):
            return r.round, f"round {r.round}: loss is {loss}"
        if math.isnan(loss) and losses_recorded and r.status != "failed":
            return r.round, f"round {r.round}: loss is nan"
        rel = float("nan") if r.rel_error is None else float(r.rel_error)
        if math.isinf(rel):
            return r.round, f"round {r.round}: decode error is {rel}"
    return None


def _verification(applied: Sequence[RoundRecord]) -> tuple[int, str | None]:
    """``(verified, word)`` over the rounds that applied a step.

    A round is verified when the PS's oracle vouched for it: it decoded as exact and has a
    finite decode error against the PS's own uncoded gradient (the oracle check holds only exact
    rounds to a tolerance; without ``--verify`` there is no decode error at all). ``word`` is
    ``"verified"`` (every applied round), ``"unverified"`` (none), ``"partly verified"`` or
    None (no round applied a step).
    """
    verified = sum(r.status == "exact" and r.rel_error is not None
                   and math.isfinite(float(r.rel_error)) for r in applied)
    if not applied:
        return 0, None
    if verified == len(applied):
        return verified, "verified"
    return verified, "unverified" if verified == 0 else "partly verified"


def _rounding_bound(stepped: Sequence[RoundRecord]) -> dict[str, Any] | None:
    """The compressed uploads' rounding bound over the rounds that applied a step
    (:attr:`RoundRecord.rounding_bound`, absolute, in gradient units): ``worst`` and its
    ``worst_round``, ``median``, ``rounds`` (how many had one). None when no round was
    compressed (``--payload-dtype same``: the key is left out of the summary)."""
    pairs = [(float(r.rounding_bound), r.round) for r in stepped
             if math.isfinite(float(r.rounding_bound))]
    if not pairs:
        return None
    worst = max(pairs)
    return {"worst": worst[0], "worst_round": worst[1],
            "median": float(np.median([b for b, _ in pairs])), "rounds": len(pairs)}


def summarize(
    records_by_scheme: Mapping[str, Sequence[RoundRecord]],
    *,
    initial_loss: float | None = None,
    end_reasons: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Per-scheme statistics of a run, JSON-serialisable (``None`` where undefined, never NaN).

    Round-time statistics cover the rounds that did not fail (a failed round produced no
    gradient step); ``wall_time_s`` sums every round. The summary reports the *worst* round,
    never hides one: any infinite loss or decode error (or a NaN loss after a step) makes the
    scheme fail, naming the first such round, and ``final_loss`` is the loss after the last
    step, not the last finite one.

    Parameters
    ----------
    records_by_scheme : mapping of str to sequence of RoundRecord
        The rounds of each scheme, in order.
    initial_loss : float, optional
        Loss of the initial model (the same for every scheme), copied to the output.
    end_reasons : mapping of str to str, optional
        Why each scheme's run ended (the PS's finish reason), copied to ``end_reason``.

    Returns
    -------
    dict
        ``{"schemes": {name: {...}}, "speedup": float | None, "speedup_vs_original": {...},
        "initial_loss": ...}``. Per scheme: ``rounds`` (completed, not failed),
        ``rounds_failed``, ``rounds_exact``, ``rounds_approximate``, ``round_time_mean_s``,
        ``round_time_p50_s``, ``round_time_p95_s``, ``round_time_max_s``, ``wall_time_s``,
        ``oracle_time_mean_s`` (mean over the rounds with an oracle time), ``overhead_ratio``
        (mean round time / mean oracle time), ``attempts_mean``, ``max_rel_decode_error``,
        ``max_residual``, ``max_amplification``, ``first_loss`` (after round 0),
        ``final_loss`` (after the last round that was not failed; None if not finite),
        ``worst_round`` (``{"round", "rel_error"}`` of the largest decode error, or None),
        ``failed_rounds`` (``[{"round", "reason", "detail"}]``: the round's
        :class:`~aiogc.protocol.status.EndReason` value and its ``end_detail``; at most
        :data:`MAX_LISTED_FAILED_ROUNDS`), ``failure`` (None, or ``"round R: loss is inf"``
        and the like), ``failed_round`` (R or None), ``end_reason`` (None if not given),
        ``rounds_rejected`` (failed rounds the round guard refused), ``rounds_verified`` /
        ``rounds_unverified`` (applied rounds the PS's oracle did / did not vouch for: exact with
        a finite decode error; approximate rounds and every round without ``--verify`` are
        unverified) and ``verification`` (``"verified"``, ``"unverified"``, ``"partly
        verified"``, or None when no round applied a step); with compressed uploads
        (``--payload-dtype float16|bfloat16``) also ``rounding_bound`` (``{"worst",
        "worst_round", "median", "rounds"}``, absolute, of the rounds that applied a step).
        ``speedup`` is the mean round time of ``original`` divided by that of ``partial``
        when both are present; ``speedup_vs_original`` gives the same ratio for every scheme.
        ``failures`` maps every failing scheme to its ``failure``; ``ok`` is True only when
        there is none *and* no round of any scheme failed (rejected, timed out, workers gone:
        a run that skipped steps is not ok, even if its losses look fine); ``unverified`` lists
        the schemes with applied rounds nobody verified.
    """
    schemes: dict[str, dict[str, Any]] = {}
    for name, recs in records_by_scheme.items():
        ok = [r for r in recs if r.status != "failed" and r.t_end is not None]
        durations = np.array([r.duration_s for r in ok], dtype=np.float64)
        oracle = _finite(r.oracle_elapsed_s for r in ok)
        mean = float(durations.mean()) if durations.size else None
        oracle_mean = float(np.mean(oracle)) if oracle else None
        rel = _finite(r.rel_error for r in recs)
        stepped = [r for r in recs if r.status != "failed"]
        worst = max(
            ((float(r.rel_error), r.round) for r in recs
             if r.rel_error is not None and not math.isnan(float(r.rel_error))),
            default=None,
        )
        nonfinite = _nonfinite_failure(recs)
        n_verified, verification = _verification(stepped)
        resid = _finite(r.residual for r in ok)
        amp = _finite(r.amplification for r in ok)

        def pct(q: float, d: np.ndarray = durations) -> float | None:
            return float(np.percentile(d, q)) if d.size else None

        schemes[name] = {
            "rounds": len(ok),
            "rounds_failed": sum(r.status == "failed" for r in recs),
            "rounds_exact": sum(r.status == "exact" for r in ok),
            "rounds_approximate": sum(r.status == "approximate" for r in ok),
            "round_time_mean_s": mean,
            "round_time_p50_s": pct(50),
            "round_time_p95_s": pct(95),
            "round_time_max_s": float(durations.max()) if durations.size else None,
            "wall_time_s": float(sum(r.duration_s for r in recs)),
            "oracle_time_mean_s": oracle_mean,
            "overhead_ratio": (mean / oracle_mean if mean is not None and oracle_mean else None),
            "attempts_mean": float(np.mean([r.attempts for r in ok])) if ok else None,
            "max_rel_decode_error": max(rel) if rel else None,
            "max_residual": max(resid) if resid else None,
            "max_amplification": max(amp) if amp else None,
            "first_loss": _opt(recs[0].loss) if recs else None,
            "final_loss": _opt(stepped[-1].loss) if stepped else None,
            "worst_round": (None if worst is None
                            else {"round": worst[1], "rel_error": worst[0]}),
            "failed_rounds": [{"round": r.round, "reason": r.end_reason, "detail": r.end_detail}
                              for r in recs if r.status == "failed"][:MAX_LISTED_FAILED_ROUNDS],
            "failure": None if nonfinite is None else nonfinite[1],
            "failed_round": None if nonfinite is None else nonfinite[0],
            "end_reason": (end_reasons or {}).get(name),
            "rounds_rejected": sum(r.status == "failed" and r.end_reason == "rejected"
                                   for r in recs),
            "rounds_verified": n_verified,
            "rounds_unverified": len(stepped) - n_verified,
            "verification": verification,
        }
        bound = _rounding_bound(stepped)
        if bound is not None:
            schemes[name]["rounding_bound"] = bound
    orig = schemes.get("original", {}).get("round_time_mean_s")
    part = schemes.get("partial", {}).get("round_time_mean_s")
    vs_orig = {
        name: (orig / s["round_time_mean_s"] if orig and s["round_time_mean_s"] else None)
        for name, s in schemes.items()
    }
    summary: dict[str, Any] = to_jsonable(
        {
            "schemes": schemes,
            "speedup": orig / part if orig and part else None,
            "speedup_vs_original": vs_orig if orig else {},
            "initial_loss": _opt(initial_loss),
            "failures": {n: s["failure"] for n, s in schemes.items() if s["failure"]},
            "ok": not any(s["failure"] or s["rounds_failed"] for s in schemes.values()),
            "unverified": [n for n, s in schemes.items() if s["rounds_unverified"]],
        }
    )
    return summary
