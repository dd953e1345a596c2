"""Scheme capabilities: declared on the :class:`Scheme` interface, never probed by name.

* ``scheme_digest`` covers every seeded array a scheme declares (``digest_arrays``): a
  test-only scheme with an extra seeded matrix, drawn differently by the workers, fails the
  PS-worker digest check on the virtual clock; drawn alike, it trains.
* Existing schemes keep their digest bytes (pinned values from before the capabilities).
* The capability methods agree with the attribute probes the protocol core still uses
  (``B``, ``E``, ``coefficients``, ``encode_trusted``, ``decode_trusted``,
  ``sends_when_done``), for every registered scheme.
* The setup memory model comes from the registry entry, usable before anything is built.
* The registration order is the one ``aiogc.coding`` imports pin (partial first).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import pytest

from aiogc.coding import (
    DECODINGS,
    DecodeResult,
    PartialScheme,
    Scheme,
    SchemeBase,
    SchemeParams,
    SchemeSpec,
    make_scheme,
    ordering_names,
    register_scheme,
    scheme_names,
    scheme_spec,
    unregister_scheme,
)
from aiogc.coding.registry import check_setup_budget, setup_bytes
from aiogc.config import RunConfig, scheme_digest
from aiogc.core import ConnectionFailed, PSPhase, Setup
from aiogc.errors import ConfigError
from tests.helpers import build_rig

ROOT = Path(__file__).resolve().parents[1] / "aiogc"

# ------------------------------------------------------------------ a test-only scheme


class ScaledPartialScheme(PartialScheme):
    """The partial scheme with a seeded per-worker scale ``R`` (m,): worker ``j`` sends
    ``R[j] * v_j`` and the PS divides it out. ``R`` is drawn from the seed after ``B`` and
    declared in :meth:`digest_arrays`, so workers that drew it differently are refused.

    ``R`` holds powers of two: the scaling is exact, so the decode equals the partial one.
    """

    name = "scaled-partial"

    def __init__(self, base: PartialScheme, R: np.ndarray) -> None:
        super().__init__(base.A, base.n_parts, base.orders, base.B)
        self.R = np.asarray(R, dtype=np.float64)

    def digest_arrays(self) -> Sequence[tuple[str, np.ndarray]]:
        return (*super().digest_arrays(), ("R", self.R))

    def _scaled(self, worker: int, v: np.ndarray) -> np.ndarray:
        return np.asarray(v * v.dtype.type(self.R[worker]))

    def _unscaled(self, coded: Mapping[int, np.ndarray] | np.ndarray
                  ) -> Mapping[int, np.ndarray] | np.ndarray:
        if isinstance(coded, np.ndarray):
            return np.asarray(coded / self.R[:, None].astype(coded.dtype))
        return {j: v / np.asarray(v).dtype.type(self.R[j]) for j, v in coded.items()}

    def encode(self, worker: int, state: object, chunk_grads: np.ndarray) -> np.ndarray:
        return self._scaled(worker, super().encode(worker, state, chunk_grads))

    def encode_trusted(self, worker: int, c: Sequence[int], chunk_grads: np.ndarray
                       ) -> np.ndarray:
        return self._scaled(worker, super().encode_trusted(worker, c, chunk_grads))

    def encode_all(self, state: object, chunk_grads: np.ndarray, out: np.ndarray) -> None:
        super().encode_all(state, chunk_grads, out)
        rows = np.flatnonzero(self.check_state(state) > 0)
        out[rows] *= self.R[rows, None].astype(out.dtype)

    def decode_result(self, coded: Mapping[int, np.ndarray] | np.ndarray, state: object,
                      dim: int) -> DecodeResult:
        return super().decode_result(self._unscaled(coded), state, dim)

    def decode_trusted(self, coded: np.ndarray, c: np.ndarray, dim: int) -> DecodeResult:
        return self.decode_result(coded, c, dim)  # no fast path of its own


def _draw_scales(m: int, rng: np.random.Generator) -> np.ndarray:
    return 2.0 ** rng.integers(-2, 3, size=m)


def _build_scaled(p: SchemeParams) -> ScaledPartialScheme:
    base = scheme_spec("partial").build(p)
    assert isinstance(base, PartialScheme)
    return ScaledPartialScheme(base, _draw_scales(p.m, p.rng))  # same rng: drawn after B


@pytest.fixture
def scaled() -> Iterator[str]:
    spec = SchemeSpec(
        name=ScaledPartialScheme.name, build=_build_scaled, sends_when_done=False,
        waiting="as partial", exactness="as partial", decoder="as partial, scales divided out",
        orderings=ordering_names(), decodings=DECODINGS, setup_bytes=PartialScheme.setup_bytes)
    register_scheme(spec)
    try:
        yield spec.name
    finally:
        unregister_scheme(spec.name)


def _legacy_digest(scheme: Scheme) -> str:
    """scheme_digest as it was before digest_arrays: only attributes named B and E."""
    h = hashlib.sha256()
    h.update(scheme.name.encode())
    h.update(np.ascontiguousarray(scheme.A, dtype=np.uint8).tobytes())
    for o in scheme.orders:
        h.update(np.ascontiguousarray(o, dtype="<i8").tobytes())
        h.update(b"|")
    for name in ("B", "E"):
        M = getattr(scheme, name, None)
        if M is not None:
            h.update(name.encode())
            h.update(np.ascontiguousarray(M, dtype="<f8").tobytes())
    return h.hexdigest()[:32]


def _cfg(name: str, **kw: object) -> RunConfig:
    base: dict[str, object] = dict(scheme=name, workers=6, delta=3, n_parts=2, rounds=3,
                                   seed=5, delay="exp:0.5")
    return RunConfig(**{**base, **kw})  # type: ignore[arg-type]


def test_seeded_extra_matrix_drawn_differently_fails_the_digest_check(scaled: str) -> None:
    cfg = _cfg(scaled)
    rig = build_rig(cfg)
    ps_scheme = rig.ps.scheme
    assert isinstance(ps_scheme, ScaledPartialScheme)

    def other_draw(c: RunConfig) -> Setup:
        # the same A, orders and B, but R drawn with another seed
        mine = c.build_scheme()
        assert isinstance(mine, ScaledPartialScheme)
        mine.R = _draw_scales(mine.m, np.random.default_rng(12345))
        assert not np.array_equal(mine.R, ps_scheme.R)
        # the old digest (B and E only) would have let this worker in
        assert _legacy_digest(mine) == _legacy_digest(ps_scheme)
        assert scheme_digest(mine) != scheme_digest(ps_scheme)
        return Setup(c, mine, rig.task.chunk_gradient)

    for w in rig.workers:
        w.setup_fn = other_draw
    rig.sim.run()
    assert rig.ps.records == []
    for j in range(cfg.workers):
        failed = [e for e in rig.sim.worker_events[j] if isinstance(e, ConnectionFailed)]
        assert failed and {(e.code, e.fatal) for e in failed} == {("config_mismatch", True)}


def test_seeded_extra_matrix_drawn_alike_passes_and_trains(scaled: str) -> None:
    cfg = _cfg(scaled)
    rig = build_rig(cfg)
    assert isinstance(rig.ps.scheme, ScaledPartialScheme)
    assert not np.all(rig.ps.scheme.R == 1.0)  # the scales are really in use
    rig.sim.run()
    assert rig.ps.phase is PSPhase.FINISHED and len(rig.ps.records) == cfg.rounds
    assert all(r.status == "exact" for r in rig.ps.records)
    for j in range(cfg.workers):
        assert not [e for e in rig.sim.worker_events[j] if isinstance(e, ConnectionFailed)]


def test_scaled_scheme_decodes_like_partial(scaled: str) -> None:
    sc = make_scheme(scaled, m=6, delta=3, n_parts=2, rng=np.random.default_rng(3))
    ref = make_scheme("partial", m=6, delta=3, n_parts=2, rng=np.random.default_rng(3))
    assert isinstance(sc, ScaledPartialScheme) and isinstance(ref, PartialScheme)
    np.testing.assert_array_equal(sc.B, ref.B)
    G = np.random.default_rng(0).standard_normal((6, 8))
    c = np.asarray(sc.loads)
    V, W = np.zeros((6, 4)), np.zeros((6, 4))
    sc.encode_all(c, G, V)
    ref.encode_all(c, G, W)
    np.testing.assert_array_equal(V, W * sc.R[:, None])
    np.testing.assert_array_equal(sc.decode_result(V, c, 8).gradient,
                                  ref.decode_result(W, c, 8).gradient)
    coded = {j: sc.encode(j, c, G[sc.orders[j]]) for j in range(6)}
    np.testing.assert_allclose(sc.decode(coded, c, 8), G.sum(axis=0), rtol=1e-12)


# ------------------------------------------------------------------ existing schemes


#: Digests of existing schemes computed before the capabilities (tree 1bad97e): the bytes the
#: PS and every worker hash must not change.
PINNED = [
    (dict(scheme="partial", workers=6, delta=3, n_parts=1, seed=0),
     "49f29947636da8c5df765aa7c0c30b18"),
    (dict(scheme="partial", workers=8, delta=4, n_parts=2, assignment="regular",
          decoding="gaussian", seed=7), "600c5684165f04e6a6d5cbe0ac6dff8e"),
    (dict(scheme="original", workers=6, delta=3, n_parts=1, seed=0),
     "c831018c70fd4a36049f18972ffdaf5b"),
    (dict(scheme="original", workers=8, delta=4, n_parts=2, seed=7),
     "0ab10ac4257a77170ccf518bedc08fb8"),
    (dict(scheme="uncoded", workers=6, delta=3, n_parts=1, seed=0),
     "8f460ba4378eeeaa2821df1faf797719"),
    (dict(scheme="ignore-stragglers", workers=6, delta=3, n_parts=1, seed=0),
     "d98175f5c722a4d7b7d9305e2a73efbe"),
]


@pytest.mark.parametrize(("kw", "digest"), PINNED)
def test_existing_scheme_digests_are_unchanged(kw: dict[str, object], digest: str) -> None:
    sc = RunConfig(**kw).build_scheme()  # type: ignore[arg-type]
    assert scheme_digest(sc) == digest
    assert _legacy_digest(sc) == digest


def _registered(name: str) -> Scheme:
    kw = dict(m=8, delta=4, n_parts=1 if scheme_spec(name).forced_n_parts else 2)
    return make_scheme(name, rng=np.random.default_rng(1), **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["partial", "original", "uncoded", "ignore-stragglers"])
def test_capabilities_agree_with_the_core_attribute_probes(name: str) -> None:
    """The replacement expressions for the core's getattr probes give what the probes give."""
    sc = _registered(name)
    assert isinstance(sc, Scheme) and isinstance(sc, SchemeBase)
    # ps.py: getattr(scheme, "B", None)  ->  scheme.conditioning_matrix()
    assert sc.conditioning_matrix() is getattr(sc, "B", None)
    # ps.py: getattr(scheme, "decode_trusted", None)  ->  scheme.trusted_decoder()
    assert sc.trusted_decoder() == getattr(sc, "decode_trusted", None)
    # worker.py: getattr(scheme, "encode_trusted", None)  ->  scheme.trusted_encoder()
    assert sc.trusted_encoder() == getattr(sc, "encode_trusted", None)
    # consistency.py: getattr(scheme, "E", None)  ->  scheme.encoding_tensor()
    assert sc.encoding_tensor() is getattr(sc, "E", None)
    # worker.py: getattr(scheme, "coefficients", None)(worker) on send-when-done schemes
    #   ->  scheme.fixed_coefficients(worker)
    for j in range(sc.m):
        fixed = sc.fixed_coefficients(j)
        if sc.sends_when_done:
            assert fixed is not None
            np.testing.assert_array_equal(fixed, sc.coefficients(j))  # type: ignore[attr-defined]
            assert fixed.shape == (int(sc.loads[j]), sc.n_parts)
        else:
            assert fixed is None
    assert sc.sends_when_done == scheme_spec(name).sends_when_done
    # the digest covers exactly the seeded arrays the old probe found
    assert [n for n, _ in sc.digest_arrays()] == [n for n in ("B", "E") if hasattr(sc, n)]


def test_manifest_extras_and_defaults() -> None:
    part = _registered("partial")
    assert list(part.manifest_extras()) == ["B", "worst_condition_number", "q_max"]
    assert part.manifest_extras()["q_max"] == part.q_max()
    for name in ("original", "uncoded", "ignore-stragglers"):
        assert _registered(name).manifest_extras() == {}


def test_setup_memory_model_comes_from_the_registry_entry(scaled: str) -> None:
    assert scheme_spec("partial").setup_bytes is PartialScheme.setup_bytes
    assert setup_bytes("partial", 128, 128, 4) == PartialScheme.setup_bytes(128, 128, 4)
    assert setup_bytes(scaled, 64, 8, 2) == setup_bytes("partial", 64, 8, 2)
    # the default: the assignment alone
    assert setup_bytes("uncoded", 100, 1, 1) == SchemeBase.setup_bytes(100, 1, 1) == 100 * 100
    # a scheme's own model is enforced before it is built (the constructor is never called)
    calls: list[SchemeParams] = []

    def build(p: SchemeParams) -> Scheme:
        calls.append(p)
        raise AssertionError("built despite its setup model")

    spec = SchemeSpec(name="greedy-test", build=build,
                      sends_when_done=True, waiting="-", exactness="-", decoder="-",
                      setup_bytes=lambda m, delta, ell: m << 30)
    register_scheme(spec)
    try:
        with pytest.raises(ConfigError) as ei:
            RunConfig(scheme="greedy-test", workers=4, delta=2)
        assert ei.value.field == "workers" and "setup budget" in str(ei.value)
        with pytest.raises(ConfigError):
            check_setup_budget("greedy-test", 4, 2, 1)
        assert not calls
    finally:
        unregister_scheme("greedy-test")


def test_registration_order_is_pinned() -> None:
    """Scheme modules register on import; aiogc.coding imports partial first (not sorted)."""
    assert scheme_names()[:4] == ("partial", "original", "uncoded", "ignore-stragglers")


def test_no_capability_probes_or_dispatch_by_scheme_name() -> None:
    """coding/, config.py and the run manifest ask the scheme, not getattr or its name."""
    caps = ("B", "E", "coefficients", "encode_trusted", "decode_trusted", "sends_when_done")
    probe = re.compile(r"getattr\([^,]+,\s*\"(" + "|".join(caps) + r")\"")
    by_name = re.compile(r"(scheme|name)\s*==\s*\"(partial|original|uncoded|ignore-stragglers)\"")
    kit = (ROOT / "harness" / "kit.py").read_text()
    manifest = kit[kit.index("def build_manifest"):kit.index("class Progress")]
    sources = {p: p.read_text() for p in [*(ROOT / "coding").glob("*.py"), ROOT / "config.py"]}
    sources[ROOT / "harness" / "kit.py"] = manifest
    for path, src in sources.items():
        assert not probe.search(src), path
        assert not by_name.search(src), path
    # and the partial scheme registers itself, in its own module
    assert 'name="partial"' in (ROOT / "coding" / "partial.py").read_text()
    assert '"partial"' not in (ROOT / "coding" / "baselines.py").read_text()


def test_a_test_only_scheme_names_no_production_file(scaled: str) -> None:
    """The scaled scheme above runs end to end with zero production files touched."""
    hits = [p for p in ROOT.rglob("*.py") if scaled in p.read_text()]
    assert hits == []
