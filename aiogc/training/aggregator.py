"""The parameter server's application work: decode, guard, SGD step, verify, loss, oracle.

The PS core (:class:`aiogc.core.ParameterServer`) does no numerical work of its own. When a
round ends it queues a :class:`~aiogc.core.ps_work.DecodeRound` item; after the next
round_start left, an :class:`~aiogc.core.ps_work.AnalyseRound` item. Its driver takes each
item (``ps.next_work()``), runs it here (``aggregator.run(item)``) and feeds the answer back
(``ps.work_done(item, answer, now=...)``), exactly as a worker's driver runs the
:class:`~aiogc.core.ComputeChunks` items of its core. This mirrors the worker: the core decides
*when* (and on which rows, which state), the aggregator *what* the numbers are.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from operator import itemgetter
from typing import Any, Literal

import numpy as np

from aiogc.coding.adaptive import unflatten_orders
from aiogc.coding.base import Scheme
from aiogc.coding.compress import widen
from aiogc.coding.consistency import (
    ORACLE_MIN_TOL,
    ORACLE_SAFETY,
    DecodedStep,
    NormGuard,
    RoundGuard,
    Verdict,
    all_finite,
    estimate_check,
    norm_floor,
    scheme_oracle_tolerance,
)
from aiogc.coding.stream import StreamChunksScheme
from aiogc.config import RunConfig
from aiogc.core.attribution import Attribution
from aiogc.core.common import UNVERIFIED, RoundRecord
from aiogc.core.ps_work import AnalyseRound, Decoded, DecodeRound
from aiogc.errors import CodingError, ConfigError
from aiogc.protocol.messages import ChunkGradient, CodedGradient
from aiogc.protocol.status import EndReason, RoundStatus
from aiogc.training.approx_bound import (
    approx_bound_check,
    decode_gain,
    exact_bound_check,
    model_sent,
)
from aiogc.training.coded_rows import CodedRows
from aiogc.training.frameworks import Stepper
from aiogc.training.locate import LiarLocator, payload_rounding_bound, relative

#: checks that vouch for a gradient's content (the norm and model checks only bound its size)
_CONTENT_CHECKS = frozenset({"oracle", "redundancy", "estimate"})


class Aggregator:
    """Decode and apply each round's gradient, and analyse the round afterwards.

    Parameters
    ----------
    config : RunConfig
    scheme : Scheme
        The run's scheme (the PS core's).
    model : ndarray, shape (d,)
        Initial model (the guard's reference for its model bound).
    learning_rate : float
    loss_fn, verify_fn : callable, optional
        ``loss_fn(w) -> float`` logged per round; ``verify_fn(w) -> (N, d)`` the uncoded chunk
        gradients, used to record each round's decode error (see ``_verify``).
    keep_gradients : bool
        Keep each round's decoded gradient in its record.
    stepper : Stepper, optional
        The task's own optimizer (a ``torch:`` / ``jax:`` task's, :mod:`.frameworks`): the
        step is ``stepper.step(w, g)``, committed once the guard accepts it. Default: plain
        SGD ``w - learning_rate * g``.
    guard : bool
        Check every decoded gradient before applying it (norm guard, two-way redundancy
        decode, the oracle when ``verify_fn`` is set, model bound; see
        :class:`aiogc.coding.consistency.RoundGuard`). A rejected round is recorded as failed
        with the reason and counted as ``rejected_<check>``; the model is left unchanged.
    grad_bound_fn : callable, optional
        ``w -> B(w) >= sum_i ||g_i(w)||`` from the task's data
        (:func:`aiogc.training.approx_bound.gradient_bound_fn`): without ``verify_fn``, an
        approximate decode above what the finished chunks can justify is rejected
        (``approx_bound``), from round 0 on, and so is an exact decode above ``B(w)`` (plus
        its rounding; ``data_bound``).
    evaluation_fn : callable, optional
        ``w -> e(w)``, how far two honest evaluations of the summed chunk gradients may be
        apart (:func:`aiogc.training.tasks.evaluation_error_fn`): the oracle's tolerance
        allows it, since the workers' evaluations need not equal ``verify_fn``'s bit for bit.
        None: unknown, and the oracle keeps its default tolerance.
    """

    def __init__(
        self,
        config: RunConfig,
        scheme: Scheme,
        *,
        model: np.ndarray,
        learning_rate: float,
        loss_fn: Callable[[np.ndarray], float] | None = None,
        verify_fn: Callable[[np.ndarray], np.ndarray] | None = None,
        keep_gradients: bool = False,
        guard: bool = True,
        grad_bound_fn: Callable[[np.ndarray], float] | None = None,
        stepper: Stepper | None = None,
        evaluation_fn: Callable[[np.ndarray], float] | None = None,
    ) -> None:
        self.config = config
        self.scheme = scheme
        self.m: int = scheme.m
        self.learning_rate = float(learning_rate)
        self.loss_fn = loss_fn
        self.verify_fn = verify_fn
        self.keep_gradients = keep_gradients
        self.grad_bound_fn = grad_bound_fn
        self.stepper = stepper
        self.evaluation_fn = evaluation_fn
        self._loads = np.asarray(scheme.loads, dtype=np.int64)
        self._orders: list[list[int]] = [[int(c) for c in o] for o in scheme.orders]
        #: ordering="adaptive": the run's scheme; ``scheme`` and ``_orders`` follow each work
        #: item's round orders (:meth:`_use_orders`)
        self._base_scheme, self._base_orders = scheme, self._orders
        self._sends_when_done = bool(scheme.sends_when_done)
        #: a streaming scheme: the round's frames are chunks (chunk -> its kept copy)
        self._streams = bool(scheme.uploads_per_chunk)
        if self._streams and config.coded_dtype != "same":
            raise ConfigError("coded_dtype", config.coded_dtype,
                              f"same for {scheme.name} (a streamed chunk is uploaded in the "
                              "payload dtype)")
        #: the round whose item runs now (a ``verify_fn`` may read it), -1 before the first
        self.round = -1
        #: cond(B) * eps(payload dtype): predicted worst relative decode error (spec §2)
        self.predicted_error = self._check_conditioning()
        # verify_fn is not called here (it may read state that does not exist yet): with it,
        # the oracle check vouches for the first rounds; without, the norm guard's warm-up does
        w0 = np.array(model, dtype=np.float64, copy=True)
        #: a 16-bit coded upload ("same": none), widened to float64 to decode
        self._coded = config.coded_dtype
        coded_eps = None if self._coded == "same" else config.coded_eps
        self.guard: RoundGuard | None = (
            RoundGuard(w0, predicted_error=self.predicted_error,
                       norm_guard=NormGuard(floor=norm_floor(config.payload_dtype, w0.size)),
                       coded_eps=coded_eps)
            if guard else None)
        #: locate an inconsistent worker where the spares allow (None: off)
        self.locator: LiarLocator | None = None
        #: the worker a located round is being decoded without (no cross-check counts then)
        self._excluding: int | None = None
        #: the coded vectors' rows (the driver receives into them) and their check
        self.rows = CodedRows(self.m, scheme.payload_len(w0.size), config.coded_wire_dtype)

    def screen(self, msg: CodedGradient | ChunkGradient) -> tuple[str, str] | None:
        """Why a coded vector cannot be used (:meth:`CodedRows.screen`), or None."""
        return self.rows.screen(msg)

    def run(self, item: DecodeRound | AnalyseRound) -> Decoded | None:
        """Run one work item of the PS core; the answer goes to ``ps.work_done``."""
        self.round = item.record.round
        if item.orders or self.scheme is not self._base_scheme:
            self._use_orders(item.orders)
        if type(item) is DecodeRound:
            return self.decode_round(item)
        assert isinstance(item, AnalyseRound)
        self.analyse_round(item)
        return None

    def _use_orders(self, flat: tuple[int, ...]) -> None:
        """Decode and analyse with the round's orders (``()``: the static ones)."""
        base = self._base_scheme
        if not flat:
            self.scheme, self._orders = base, self._base_orders
            return
        orders = unflatten_orders(base.A, flat)
        sch = base.with_orders(orders)
        if sch is None:
            raise ConfigError("ordering", "adaptive", f"a scheme that takes other orders, not "
                              f"{base.name}")
        self.scheme = sch
        self._orders = [o.tolist() for o in orders]

    # ------------------------------------------------------------------ stage 1: decode, step

    def decode_round(self, item: DecodeRound) -> Decoded:
        """Decode the round's gradient from the PS's payload rows and take the step.

        Fills the record's decode fields (status, end reason, residual, amplification, the
        gradient if kept). Returns the model to broadcast next (unchanged if the round failed)
        and the counters to bump.
        """
        rec, w_prev = item.record, item.model
        if not item.decode:
            rec.attribution = Attribution(np.zeros((self.scheme.n_parts, self.m)), self._orders,
                                          self.scheme.n_chunks)
            return Decoded(w_prev, None, ())
        rec.attempts = item.attempt + 1
        if self._streams:
            assert isinstance(self.scheme, StreamChunksScheme)
            rows = self.rows.streamed(item.coded,  # type: ignore[arg-type]
                                      self.scheme.designated(item.state), self._orders)
        else:
            received = self.rows.fill(item.coded)  # type: ignore[arg-type]
            rows = received if self._coded == "same" else widen(received, self._coded)
        result = self._decode(rows, item.state, item.dim)
        rec.attribution = Attribution(self._weights(result, item.state), self._orders,
                                      self.scheme.n_chunks)
        grad = np.asarray(result.gradient, dtype=np.float64)
        if not all_finite(grad):
            located = self._locate_and_exclude(item, rows) if self.locator else None
            if located is not None:
                return located
            rec.status = RoundStatus.FAILED
            rec.end_reason = EndReason.NONFINITE
            rec.end_detail = "decoded gradient is not finite"
            return Decoded(w_prev, None, ("nonfinite_decode", "failed_rounds"))
        rec.residual = float(result.residual)
        rec.amplification = float(result.amplification)
        rec.status = (RoundStatus.EXACT if (result.exact and item.exact)
                      else RoundStatus.APPROXIMATE)
        rec.end_reason = EndReason(item.reason)
        if self._coded != "same":
            rec.rounding_bound = payload_rounding_bound(
                self.scheme, item.state, rows, self._coded, self.config.payload_dtype)
        if self.keep_gradients:
            rec.gradient = grad.copy()
        if self.guard is None:
            if self.stepper is not None:
                new = self.stepper.step(w_prev, grad)
                self.stepper.commit()
                return Decoded(new, grad, ())
            return Decoded(w_prev - self.learning_rate * grad, grad, ())
        return self._guarded_step(item, grad, rows)

    def _guarded_step(self, item: DecodeRound, grad: np.ndarray, rows: np.ndarray) -> Decoded:
        """Apply ``grad`` only if the round guard vouches for it; else fail the round."""
        assert self.guard is not None
        rec, w_prev = item.record, item.model
        estimate: Verdict | None = None
        rounding = 0.0
        evaluation: float | None = 0.0
        if self.verify_fn is not None:
            # a PS that verifies never applies an unverified step: the oracle runs here,
            # before the update, rather than with the analytics
            G = np.asarray(self.verify_fn(w_prev), dtype=np.float64)
            rec.rel_error, rec.rel_error_plain, scale = self._verify(grad, w_prev, G)
            if self._coded != "same":
                rounding = relative(rec.rounding_bound, scale)
            evaluation = (None if self.evaluation_fn is None
                          else relative(self.evaluation_fn(w_prev), scale))
            if rec.status != RoundStatus.EXACT:
                # an approximate round differs from the truth by design, but not from the
                # estimate honest workers would have produced from the same finished chunks
                estimate = self._estimate_verdict(item, grad, G, rec.amplification, rounding)
        elif rec.status != RoundStatus.EXACT and (out := self._data_bound(item, grad)) is not None:
            return out
        if estimate is not None and not estimate.ok:
            self.guard.rejected[estimate.check] = self.guard.rejected.get(estimate.check, 0) + 1
            return self._reject(item, estimate)
        bad, new = self.guard.check(
            scheme=self.scheme, coded=rows, received=np.flatnonzero(item.state > 0),
            dim=item.dim, decoded=DecodedStep(grad, rec.status == "exact", rec.rel_error,
                                              rounding, evaluation),
            model=w_prev, learning_rate=self.learning_rate,
            step=None if self.stepper is None else self.stepper.step)
        if bad is not None:
            if self.locator is not None and bad.check != "model":
                located = self._locate_and_exclude(item, rows)
                if located is not None:
                    return located
            return self._reject(item, bad)  # an uncommitted step is undone by the next one
        assert new is not None
        # an exact round's data bound runs last: a lie the redundancy check sees is the
        # locator's to exclude, not a lost round
        if rec.status == RoundStatus.EXACT and (out := self._data_bound(item, grad)) is not None:
            return out
        self.guard.accept()
        if self.stepper is not None:
            self.stepper.commit()
        self._say_what_vouched(item, estimate is not None)
        return Decoded(new, grad, ())

    def _say_what_vouched(self, item: DecodeRound, estimated: bool) -> None:
        """An applied round that no content check vouched for says so in its record (only
        size bounds held this step); with a locator, see :meth:`_after_evictions`."""
        assert self.guard is not None
        passed = set(self.guard.last_passed)
        if not estimated and not _CONTENT_CHECKS.intersection(passed):
            bounds = "norm and model" if self.grad_bound_fn is None else "norm, data and model"
            item.record.end_detail = (f"{UNVERIFIED}: no oracle and no spare vector to "
                                      f"cross-check; only the {bounds} bounds applied")
        elif self.locator is not None:
            self._after_evictions(item, vouched_by_oracle=estimated or "oracle" in passed)

    def _after_evictions(self, item: DecodeRound, *, vouched_by_oracle: bool) -> None:
        """A round a content check passed: its workers cross-checked (when no vector was
        excluded), and, when only the redundancy check vouched, the round marked
        ``unverified`` where an eviction (or this round's exclusion) left chunks held only by
        workers never cross-checked (:class:`~aiogc.training.locate.LiarLocator`)."""
        assert self.locator is not None
        received = np.flatnonzero(item.state > 0)
        excluded = () if self._excluding is None else (self._excluding,)
        if not excluded:
            self.locator.vouched(self._orders, received)
        if vouched_by_oracle:
            return
        bare = self.locator.unvouched(self._orders, excluded)
        if bare:
            chunks = sorted(bare)
            holders = sorted({w for ws in bare.values() for w in ws})
            gone = sorted({*self.locator.evicted, *excluded})
            item.record.end_detail = (
                f"{UNVERIFIED}: without worker(s) {gone} (evicted or excluded), chunk(s) "
                f"{chunks} are held only by worker(s) {holders}, never cross-checked with "
                "another holder; their agreement is all the redundancy check saw")

    def _locate_and_exclude(self, item: DecodeRound, rows: np.ndarray) -> Decoded | None:
        """The one worker whose vector breaks consistency, if the spares say whose;
        the round is then decoded (and guarded again) from the others. None: not located."""
        assert self.locator is not None
        j = self.locator.locate(self.scheme, rows, item.state, item.dim)
        if j is None:
            return None
        rest = item.state.copy()
        rest[j] = 0
        self._excluding = j
        try:
            redo = self.decode_round(item._replace(state=rest))
        finally:
            self._excluding = None
        if redo.gradient is None:
            return None  # the rest did not pass the guard either: rejected as found
        evict = self.locator.record(j, item.record.round)
        rec = item.record
        note = rec.end_detail if rec.end_detail.startswith(UNVERIFIED) else ""
        rec.end_detail = (f"{note}; " if note else "") + self.locator.describe(j)
        return Decoded(redo.model, redo.gradient, (*redo.counters, "located_inconsistent"),
                       (j,) if evict else ())

    @staticmethod
    def _reject(item: DecodeRound, bad: Verdict) -> Decoded:
        rec = item.record
        rec.status = RoundStatus.FAILED
        rec.end_reason = EndReason.REJECTED
        rec.end_detail = f"rejected by {bad.check} check: {bad.reason}"
        return Decoded(item.model, None, (f"rejected_{bad.check}", "failed_rounds"))

    def honest_estimate(self, state: np.ndarray, G: np.ndarray, dim: int) -> np.ndarray:
        """What the decoder returns at ``state`` when every contributing worker is honest:
        their payloads re-encoded here from the PS's own chunk gradients (float64), decoded
        the same way.

        Parameters
        ----------
        state : ndarray of int64, shape (m,)
            The state the round's vectors were encoded against (send-when-done: the loads
            of the finished workers, 0 elsewhere).
        G : ndarray, shape (N, d)
            The uncoded chunk gradients at the round's model (``verify_fn``).
        dim : int

        Returns
        -------
        ndarray, shape (d,)
        """
        scheme = self.scheme
        st = np.asarray(state, dtype=np.int64)
        rows = np.zeros((self.m, scheme.payload_len(dim)), dtype=np.float64)
        for j in np.flatnonzero(st > 0):
            if self._sends_when_done and st[j] < self._loads[j]:
                continue  # not finished: sends nothing, the decoder does not read it
            rows[j] = scheme.encode(int(j), st, G[self._orders[j]])
        return np.asarray(scheme.decode_result(rows, st, dim).gradient, dtype=np.float64)

    def _estimate_verdict(self, item: DecodeRound, grad: np.ndarray, G: np.ndarray,
                          amplification: float, rounding: float = 0.0) -> Verdict:
        """The approximate-round oracle: ``grad`` against :meth:`honest_estimate`."""
        honest = self.honest_estimate(item.state, G, item.dim)
        absum = np.abs(G).sum(axis=0)
        return estimate_check(grad, honest, float(math.sqrt(absum.dot(absum))),
                              self.predicted_error, amplification, rounding=rounding)

    def _weights(self, result: Any, state: np.ndarray) -> np.ndarray:
        """The decode's coefficients (ell, m): the scheme's own, or, for a scheme that does
        not report them, probed: decoding the identity (``coded = I_m``, ``d = ell * m``)
        returns ``W`` itself, since the decode is linear in the coded vectors."""
        w = result.weights
        if w is not None:
            return np.asarray(w, dtype=np.float64)
        ell = self.scheme.n_parts
        probe = self.scheme.decode_result(np.eye(self.m), state, ell * self.m).gradient
        return np.asarray(probe, dtype=np.float64).reshape(ell, self.m)

    def _data_bound(self, item: DecodeRound, grad: np.ndarray) -> Decoded | None:
        """Without the oracle: the round rejected if ``||grad||`` exceeds what the
        finished chunks can justify, ``decode gain x B(w)`` (gain 1 for an exact round) plus
        the decode's rounding (training/approx_bound.py); None when it passes or no bound
        applies. A bound on size, not a content check: a passing round stays unverified."""
        if self.grad_bound_fn is None or self.verify_fn is not None:
            return None
        assert self.guard is not None
        rec, dtype = item.record, self.config.payload_dtype
        bound = self.grad_bound_fn(model_sent(item.model, dtype))
        rounding = 2.0 * rec.rounding_bound if self._coded != "same" else 0.0
        floor = self.guard.norms.floor
        if rec.status == RoundStatus.EXACT:
            tol = scheme_oracle_tolerance(self.scheme, dtype, self.predicted_error)
            rel = tol if tol is not None else max(ORACLE_MIN_TOL,
                                                  ORACLE_SAFETY * self.predicted_error)
            verdict = exact_bound_check(grad, bound, rel_tol=rel, floor=floor, abs_tol=rounding)
        else:
            gain = decode_gain(self.honest_estimate, item.state, self.scheme.n_chunks,
                               self.scheme.n_parts)
            amp = rec.amplification if math.isfinite(rec.amplification) else 1.0
            rel = max(ORACLE_MIN_TOL, ORACLE_SAFETY * self.predicted_error * max(1.0, amp))
            verdict = approx_bound_check(grad, gain, bound, floor=floor, rel_tol=rel,
                                         abs_tol=rounding)
        if verdict.ok:
            return None
        self.guard.rejected[verdict.check] = self.guard.rejected.get(verdict.check, 0) + 1
        return self._reject(item, verdict)

    def _decode(self, rows: np.ndarray, state: np.ndarray, dim: int) -> Any:
        fast = self.scheme.trusted_decoder()
        if fast is not None:
            return fast(rows, state, dim)
        return self.scheme.decode_result(rows, state, dim)

    # ------------------------------------------------------------------ stage 2: analytics

    def analyse_round(self, item: AnalyseRound) -> None:
        """Decode error, loss, oracle and coverage of an ended round, into its record."""
        rec = item.record
        if item.gradient is not None:
            if self.verify_fn is not None and math.isnan(rec.rel_error):
                rec.rel_error, rec.rel_error_plain, _ = self._verify(item.gradient, item.w_prev)
            rec.oracle_elapsed_s = item.oracle_hint if item.oracle_live else self._oracle(rec)
        if self.loss_fn is not None:
            rec.loss = float(self.loss_fn(item.w_new))
        rec.coverage_min = self._coverage_min(rec.state)

    def _coverage_min(self, state: tuple[int, ...]) -> int:
        if not self.m:
            return 0
        cov = [0] * self.scheme.n_chunks
        for j, c in enumerate(state):
            for i in self._orders[j][:c]:
                cov[i] += 1
        return min(cov) if cov else 0

    def _verify(self, grad: np.ndarray, w: np.ndarray,
                G: np.ndarray | None = None) -> tuple[float, float, float]:
        """Decode error against the uncoded sum g = Σ_i g_i of this round's chunk gradients
        (at ``w``, the model the round computed on).

        Returns ``(scaled, plain, scale)``: ``plain = ||ĝ - g|| / ||g||`` and
        ``scaled = ||ĝ - g|| / scale`` with ``scale = ||Σ_i |g_i| ||``. The second divides by
        the magnitude the floating-point sums work at (the classic summation-error scale):
        near an optimum the chunk gradients cancel, ``||g|| -> 0``, and ``plain`` then
        measures the problem's cancellation rather than the decoder. Both are recorded;
        summaries use ``scaled``.
        ``grad`` and ``w`` have shape (d,).
        """
        if G is None:
            assert self.verify_fn is not None
            G = np.asarray(self.verify_fn(w), dtype=np.float64)
        true = G.sum(axis=0)
        with np.errstate(over="ignore", invalid="ignore"):  # a liar's 1e300: err is inf
            diff = grad - true
            # sqrt(x . x): what np.linalg.norm computes for a real vector, bit for bit,
            # without its argument handling, which costs more than the dot on small d
            # (three norms per round, on the round's critical path)
            err = math.sqrt(diff.dot(diff))
        absum = np.abs(G).sum(axis=0)
        plain_den = math.sqrt(true.dot(true))
        scale_den = math.sqrt(absum.dot(absum))
        plain = err / plain_den if plain_den > 0 else err
        scaled = err / scale_den if scale_den > 0 else err
        return scaled, plain, scale_den

    def _finished_state(self, workers: list[int]) -> np.ndarray:
        """State vector in which exactly ``workers`` finished all their chunks; shape (m,)."""
        st = np.zeros(self.m, dtype=np.int64)
        st[workers] = self._loads[workers]
        return st

    def _oracle(self, rec: RoundRecord) -> float | None:
        """Earliest elapsed time (workers' own stamps) at which reported counts were decodable.

        Only reported counts are known, so this is exact when every chunk is reported
        (report_every = 1) and an upper bound otherwise. For the send-when-done schemes a
        worker's finish time is the ``compute_s`` its coded vector carries (the elapsed time of
        its last chunk on its own schedule). Computed post hoc, once per round, from the same
        coverage counters the trigger uses. (When the reports arrived in order of their stamps
        and no coverage was removed, the PS core's live counters already met this answer: it
        passes it along and this is not called; ``tests/test_core.py`` checks the two agree.)
        """
        if self._sends_when_done:
            # decodability only grows with the finished set: binary search over the workers
            # in order of their finish times
            fin = sorted((e, w) for w, e in rec.compute_s.items())
            order = [w for _, w in fin]
            if not fin or not self.scheme.is_decodable(self._finished_state(order)):
                return None
            lo, hi = 1, len(order)
            while lo < hi:
                mid = (lo + hi) // 2
                if self.scheme.is_decodable(self._finished_state(order[:mid])):
                    hi = mid
                else:
                    lo = mid + 1
            return float(fin[lo - 1][0])
        cover = self.scheme.progress_tracker()
        st = [0] * self.m
        for _, w, c, elapsed in sorted(rec.reports, key=itemgetter(3)):
            if c > st[w]:
                cover.add(w, st[w], c)
                st[w] = c
                if cover.deficit == 0:
                    return float(elapsed)
        return None

    # ------------------------------------------------------------------ construction

    def _check_conditioning(self) -> float:
        """Refuse (or warn about) a decoding matrix B whose worst ℓ-subset condition number
        predicts more relative error than ``config.max_predicted_error`` for the payload dtype.
        """
        B = self.scheme.conditioning_matrix()
        if B is None or self.scheme.n_parts == 1:
            return float(np.finfo(self.config.payload_dtype).eps)  # B = 1ᵀ, condition 1
        from aiogc.coding import check_conditioning

        mode: Literal["raise", "warn"] = (
            "raise" if self.config.on_ill_conditioned == "raise" else "warn"
        )
        try:
            return check_conditioning(self.scheme.A, B, self.scheme.n_parts,
                                      self.config.payload_dtype,
                                      tol=self.config.max_predicted_error, on_fail=mode)
        except CodingError as exc:
            raise ConfigError("max_predicted_error", self.config.max_predicted_error,
                              f"a bound the decoding matrix meets ({exc})") from exc
