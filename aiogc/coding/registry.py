"""The scheme registry: every scheme declared once, read by config, runner, sim, records and CLI.

A :class:`SchemeSpec` says what a scheme *is* for everything outside the coding library: its
name, how to build it from configuration values, whether the PS triggers encoding or workers
send when done, the waiting rule and exactness (in words, for help texts and docs; the rules
themselves are the scheme's :meth:`~aiogc.coding.base.SchemeBase.is_decodable`,
:meth:`~aiogc.coding.base.SchemeBase.decode_times` and
:meth:`~aiogc.coding.base.SchemeBase.exact_states`), the ``ell`` it forces and the
assignments, orderings and decodings it accepts.

Adding a scheme is one :func:`register_scheme` call, in the scheme's own module (imported by
``aiogc/coding/__init__.py``) or in a test module: the config validates the name against the
registry and checks its setup memory model (:attr:`SchemeSpec.setup_bytes`), :func:`make_scheme`
builds it, the fast path asks the built scheme for its decode times, the protocol core calls
its ``is_decodable`` / ``contributes`` / ``encode`` / ``decode_result`` and its declared
capabilities (:class:`~aiogc.coding.base.Scheme`), and the records ask
:func:`sends_when_done`. See docs/coding.md, "Adding a scheme".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import numpy as np

from aiogc.coding.assignments import (
    cyclic_assignment,
    fractional_repetition_assignment,
    regular_assignment,
    validate_assignment,
)
from aiogc.coding.base import Scheme, SchemeBase
from aiogc.errors import CodingError, ConfigError

__all__ = [
    "ASSIGNMENTS",
    "CLASSIC_ASSIGNMENTS",
    "DECODINGS",
    "SETUP_MEMORY_BUDGET",
    "SchemeChoices",
    "SchemeParams",
    "SchemeSpec",
    "build_assignment",
    "check_setup_budget",
    "make_scheme",
    "register_scheme",
    "scheme_names",
    "scheme_spec",
    "sends_when_done",
    "setup_bytes",
    "spec_of_label",
    "unregister_scheme",
]

#: Assignment constructions of equal loads (every scheme with an assignment accepts them).
CLASSIC_ASSIGNMENTS: tuple[str, ...] = ("cyclic", "fr", "regular")
#: Assignment constructions a configuration may name (see :func:`build_assignment`);
#: ``speed-aware`` (:mod:`aiogc.coding.hetero`) gives faster workers more chunks.
ASSIGNMENTS: tuple[str, ...] = (*CLASSIC_ASSIGNMENTS, "speed-aware")
# Processing orders: the registry of aiogc.coding.orderings (ordering_names, register_ordering).
#: Decoding-matrix constructions of the partial scheme a configuration may name.
DECODINGS: tuple[str, ...] = ("frame", "gaussian")


@dataclass(frozen=True)
class SchemeParams:
    """Validated configuration values a scheme is built from.

    Attributes
    ----------
    m, delta, n_parts : int
        Workers, load per worker, ``ell`` (already the scheme's forced value, if it forces one).
    assignment, ordering, decoding : str
    k : int or None
        Finished workers to wait for (schemes with ``uses_k``).
    rng : numpy.random.Generator
        The only randomness a constructor may use (same seed on every side).
    A : ndarray of bool, shape (N, m), optional
        Explicit assignment overriding ``assignment``.
    speeds, sizes : ndarray, shape (m,), optional
        Relative worker speeds and chunk sizes of a heterogeneous cluster
        (:mod:`aiogc.coding.hetero`); None: uniform.
    """

    m: int
    delta: int
    n_parts: int = 1
    assignment: str = "cyclic"
    ordering: str = "optimal"
    decoding: str = "frame"
    k: int | None = None
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))
    A: np.ndarray | None = None
    speeds: np.ndarray | None = None
    sizes: np.ndarray | None = None


@dataclass(frozen=True)
class SchemeSpec:
    """One scheme, declared once.

    Attributes
    ----------
    name : str
        Registry key; also ``scheme.name`` of what :attr:`build` returns.
    build : callable (SchemeParams) -> Scheme
        Constructor; may raise :class:`~aiogc.errors.CodingError` (reported as a ConfigError).
    sends_when_done : bool
        True: a worker sends one vector after finishing all its chunks. False: the PS triggers
        encoding from the reported progress (``encode_and_transmit``), or (``uploads_per_chunk``)
        the workers stream their chunks.
    waiting : str
        The waiting rule in words (CLI help, docs); the rule itself is the built scheme's
        ``is_decodable`` / ``decode_times``.
    exactness : str
        When a decode is algebraically exact, in words; the rule is ``exact_states``.
    decoder : str
        Which decoder the scheme uses (docs: a baseline must be at its strongest).
    forced_n_parts : int or None
        ``ell`` the scheme always uses whatever the configuration says (comparisons replace
        the configured ``ell`` by it; a single-scheme configuration must state it).
    assignments : tuple of str
        Assignment constructions accepted; empty: the scheme builds its own (ignores it).
    orderings, decodings : tuple of str
        Orderings / decodings accepted; empty: ignored.
    uses_k : bool
        Whether the configuration's ``k`` applies.
    min_redundancy : int
        Smallest ``delta - ell`` accepted (original gradient coding needs ``s >= 1``).
    min_finished : callable (SchemeParams) -> int
        Fewest finished workers that always suffice (the classic straggler tolerance is ``m``
        minus this); default ``m - (delta - ell)``.
    setup_bytes : callable (m, delta, n_parts) -> int
        The setup memory model (usually the scheme class's static ``setup_bytes``), checked
        against :data:`SETUP_MEMORY_BUDGET` before anything is built; default
        :meth:`SchemeBase.setup_bytes` (the assignment only).
    uploads_per_chunk : bool
        A worker sends every computed chunk's gradient as its own frame (``chunk_gradient``),
        unprompted; the built scheme's attribute of the same name.
    live : bool
        Whether the protocol core can run it (live runs, the protocol engine); False for a
        scheme only the fast path models (none of the built-in schemes).
    assignment_refusals : tuple of (str, str)
        (assignment, why) pairs: a known construction this scheme refuses, and the reason
        the refusal names (``original`` and ``speed-aware``).
    """

    name: str
    build: Callable[[SchemeParams], Scheme]
    sends_when_done: bool
    waiting: str
    exactness: str
    decoder: str
    forced_n_parts: int | None = None
    assignments: tuple[str, ...] = CLASSIC_ASSIGNMENTS
    orderings: tuple[str, ...] = ()
    decodings: tuple[str, ...] = ()
    uses_k: bool = False
    min_redundancy: int = 0
    min_finished: Callable[[SchemeParams], int] = lambda p: p.m - (p.delta - p.n_parts)
    setup_bytes: Callable[[int, int, int], int] = SchemeBase.setup_bytes
    uploads_per_chunk: bool = False
    live: bool = True
    assignment_refusals: tuple[tuple[str, str], ...] = ()

    def check(self, p: SchemeParams) -> None:
        """Raise :class:`ConfigError` (naming the field) if ``p`` is not valid for this scheme."""
        if self.forced_n_parts is not None and p.n_parts != self.forced_n_parts:
            raise ConfigError("n_parts", p.n_parts, f"{self.forced_n_parts} for scheme {self.name}")
        if p.delta - p.n_parts < self.min_redundancy:
            raise ConfigError("n_parts", p.n_parts,
                              f"<= delta - {self.min_redundancy} = "
                              f"{p.delta - self.min_redundancy} for scheme {self.name}")
        if self.assignments and p.A is None and p.assignment not in self.assignments:
            why = dict(self.assignment_refusals).get(p.assignment)
            raise ConfigError("assignment", p.assignment,
                              f"one of {', '.join(self.assignments)} for scheme {self.name}"
                              + (f": {why}" if why else ""))
        for fname, allowed in (("ordering", self.orderings), ("decoding", self.decodings)):
            value = getattr(p, fname)
            if allowed and value not in allowed:
                raise ConfigError(fname, value, f"one of {', '.join(allowed)} for {self.name}")
        if p.k is not None and not 1 <= p.k <= p.m:
            raise ConfigError("k", p.k, f"an integer in [1, {p.m}]")


_REGISTRY: dict[str, SchemeSpec] = {}


def register_scheme(spec: SchemeSpec, *, replace: bool = False) -> SchemeSpec:
    """Add ``spec`` to the registry (``replace=True`` to redefine a name); returns it."""
    if not spec.name or not isinstance(spec.name, str):
        raise ConfigError("scheme", spec.name, "a non-empty name")
    if spec.name in _REGISTRY and not replace:
        raise ConfigError("scheme", spec.name, "a name not registered yet")
    _REGISTRY[spec.name] = spec
    return spec


def unregister_scheme(name: str) -> None:
    """Remove ``name`` (a test that registered a scheme cleans up with this)."""
    _REGISTRY.pop(name, None)


def scheme_names() -> tuple[str, ...]:
    """Registered scheme names, in registration order."""
    return tuple(_REGISTRY)


def scheme_spec(name: str) -> SchemeSpec:
    """The spec of ``name``; ConfigError naming the registered schemes otherwise."""
    spec = _REGISTRY.get(name)
    if spec is None:
        raise ConfigError("scheme", name, "one of " + ", ".join(_REGISTRY))
    return spec


def spec_of_label(label: str) -> SchemeSpec:
    """The spec a record label names: a registered name, or one followed by ``-variant`` or
    ``:variant`` (``partial-random``: the random-ordering variant of partial); the longest
    registered name that prefixes the label decides. ConfigError if none does."""
    if label in _REGISTRY:
        return _REGISTRY[label]
    prefixes = [n for n in _REGISTRY if label.startswith((n + "-", n + ":"))]
    if not prefixes:
        raise ConfigError("scheme", label, "a registered scheme name, optionally with "
                          "-variant: " + ", ".join(_REGISTRY))
    return _REGISTRY[max(prefixes, key=len)]


def sends_when_done(name: str) -> bool:
    """Whether scheme ``name`` sends when done (False: the PS triggers encoding)."""
    return scheme_spec(name).sends_when_done


#: Largest estimated working set (bytes) of building a scheme and decoding one round with it.
#: Configurations above it are refused before anything is allocated (a PS would otherwise
#: grow for minutes before listening, and a worker given the config in ``welcome`` would block).
SETUP_MEMORY_BUDGET = 1 << 30


def setup_bytes(scheme: str, m: int, delta: int, n_parts: int) -> int:
    """Estimated peak bytes of building ``scheme`` and decoding one round (model excluded).

    The scheme's own memory model (:attr:`SchemeSpec.setup_bytes`, e.g.
    :meth:`PartialScheme.setup_bytes <aiogc.coding.partial.PartialScheme.setup_bytes>`):
    the arrays the construction and one decode allocate, for N = m chunks (cyclic, regular
    and fractional-repetition assignments all have m chunks) of ``delta`` holders each.

    Parameters
    ----------
    scheme : str
        A registered scheme name.
    m, delta, n_parts : int
        Workers, chunks per worker and ell.

    Returns
    -------
    int
        Bytes (an estimate, within a small factor of the measured peak).
    """
    return int(scheme_spec(scheme).setup_bytes(m, delta, n_parts))


def check_setup_budget(
    scheme: str, m: int, delta: int, n_parts: int, budget: int = SETUP_MEMORY_BUDGET
) -> int:
    """Refuse a configuration whose setup would exceed ``budget`` bytes (:func:`setup_bytes`).

    Returns
    -------
    int
        The estimate, when within budget.

    Raises
    ------
    ConfigError
        Naming ``delta`` and the largest delta within budget for these workers and ell, or
        ``workers`` when no delta fits.
    """
    need = setup_bytes(scheme, m, delta, n_parts)
    if need <= budget:
        return need
    lo = max(1, n_parts + scheme_spec(scheme).min_redundancy)
    mib = f"~{need / 2**20:.0f} MiB, over the {budget / 2**20:.0f} MiB setup budget"
    if lo <= m and setup_bytes(scheme, m, lo, n_parts) <= budget:
        best = lo
        hi = delta  # setup_bytes grows with delta: binary search for the largest that fits
        while best + 1 < hi:
            mid = (best + hi) // 2
            if setup_bytes(scheme, m, mid, n_parts) <= budget:
                best = mid
            else:
                hi = mid
        raise ConfigError(
            "delta", delta,
            f"an integer in [{lo}, {best}] for scheme={scheme}, workers={m}, n_parts={n_parts} "
            f"(this setup needs {mib})",
        )
    best, hi = 1, m
    while best + 1 < hi:
        mid = (best + hi) // 2
        if setup_bytes(scheme, mid, min(delta, mid), n_parts) <= budget:
            best = mid
        else:
            hi = mid
    raise ConfigError(
        "workers", m,
        f"an integer in [1, {best}] for scheme={scheme}, n_parts={n_parts} "
        f"(this setup needs {mib})",
    )


def _int_field(fname: str, value: object, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or not lo <= value <= hi:
        raise ConfigError(fname, value, f"an integer in [{lo}, {hi}]")
    return int(value)


def build_assignment(p: SchemeParams) -> np.ndarray:
    """The assignment ``A`` (N, m) of ``p``: ``p.A`` if given, else ``p.assignment`` built.

    Raises
    ------
    ConfigError
        Unknown construction, or ``delta`` not dividing ``m`` for ``"fr"``.
    """
    if p.A is not None:
        Av = validate_assignment(p.A)
        if Av.shape[1] != p.m:
            raise ConfigError("A", Av.shape, f"an (N, m={p.m}) 0/1 matrix")
        return Av
    if p.assignment == "cyclic":
        return cyclic_assignment(p.m, p.delta)
    if p.assignment == "fr":
        if p.m % p.delta:
            raise ConfigError("delta", p.delta, f"a divisor of m={p.m} for assignment='fr'")
        return fractional_repetition_assignment(p.m, p.delta - 1)
    if p.assignment == "regular":
        return regular_assignment(p.m, p.delta, p.rng)
    if p.assignment == "speed-aware":
        from aiogc.coding.hetero import speed_aware_assignment

        return speed_aware_assignment(p.m, p.delta, p.speeds, p.sizes)
    raise ConfigError("assignment", p.assignment, "one of " + ", ".join(ASSIGNMENTS))


@dataclass(frozen=True)
class SchemeChoices:
    """How :func:`make_scheme` builds a scheme beyond its size and assignment family: the chunk
    ``ordering`` (:func:`~aiogc.coding.orderings.ordering_names`), the ``decoding`` matrix
    construction (:data:`DECODINGS`) and an explicit assignment ``A`` (ndarray of bool, shape
    (N, m); overrides the family); ``speeds`` / ``sizes`` (shape (m,)) of a heterogeneous
    cluster, None: uniform."""

    ordering: str = "optimal"
    decoding: str = "frame"
    A: np.ndarray | None = None
    speeds: np.ndarray | None = None
    sizes: np.ndarray | None = None


DEFAULT_CHOICES: Final = SchemeChoices()


def make_scheme(
    name: str,
    *,
    m: int,
    delta: int,
    n_parts: int = 1,
    assignment: str = "cyclic",
    k: int | None = None,
    rng: np.random.Generator | None = None,
    choices: SchemeChoices = DEFAULT_CHOICES,
) -> Scheme:
    """Build the registered scheme ``name`` from configuration values.

    Parameters
    ----------
    name : str
        A registered scheme (:func:`scheme_names`).
    m : int
        Workers.
    delta : int
        Load per worker.
    n_parts : int
        ``ell``; replaced by the scheme's ``forced_n_parts`` if it has one.
    assignment : {"cyclic", "fr", "regular"}
        Ignored when ``A`` is given or the scheme builds its own.
    k : int, optional
        Workers waited for (schemes with ``uses_k``).
    rng : numpy.random.Generator, optional
        ``None`` means ``default_rng(0)``.
    choices : SchemeChoices, optional
        ``ordering`` and ``decoding`` (checked against the scheme's accepted values) and an
        explicit assignment ``A`` (shape (N, m)); default ``optimal``, ``frame``, none.

    Raises
    ------
    ConfigError
        Unknown names or out-of-range values (field, value and allowed range named).
    """
    spec = scheme_spec(name)
    m = _int_field("m", m, 1, 1 << 20)
    delta = _int_field("delta", delta, 1, m)
    n_parts = _int_field("n_parts", n_parts, 1, delta)
    if spec.forced_n_parts is not None:
        n_parts = spec.forced_n_parts
    if k is not None:
        k = _int_field("k", k, 1, m)
    p = SchemeParams(m=m, delta=delta, n_parts=n_parts, assignment=assignment,
                     ordering=choices.ordering, decoding=choices.decoding, k=k,
                     rng=rng if rng is not None else np.random.default_rng(0), A=choices.A,
                     speeds=choices.speeds, sizes=choices.sizes)
    spec.check(p)
    try:
        scheme = spec.build(p)
    except CodingError as exc:
        raise ConfigError(name, {"m": m, "delta": delta, "n_parts": n_parts}, str(exc)) from exc
    if (scheme.sends_when_done != spec.sends_when_done or scheme.name != name
            or scheme.uploads_per_chunk != spec.uploads_per_chunk):
        raise ConfigError("scheme", name,
                          f"a constructor returning a scheme named {name!r} with "
                          f"sends_when_done={spec.sends_when_done} and "
                          f"uploads_per_chunk={spec.uploads_per_chunk}")
    return scheme
