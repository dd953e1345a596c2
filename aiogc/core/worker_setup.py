"""What a worker is given to run a configuration (:class:`Setup`), and what the workers of one
process learn once and share (:class:`WorkerCache`).

No process-global state: a driver or host that runs several workers in one process creates
one :class:`WorkerCache` and passes it to each of them (``Worker(j, cache=cache)``); a worker
given none keeps a private one. Sharing only saves work: a worker computes the same values
from a private cache.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from aiogc.coding.base import Scheme
from aiogc.config import RunConfig, scheme_digest

__all__ = ["ChunkGradientFn", "SchemeFacts", "Setup", "WorkerCache"]

#: :meth:`WorkerCache.config` keeps at most this many configs (cleared when full): a process
#: sees one config per run, a few at most
MAX_WIRE_CONFIGS = 16


class ChunkGradientFn(Protocol):
    def __call__(self, chunk: int, w: np.ndarray) -> np.ndarray: ...


@dataclass
class SchemeFacts:
    """What the workers of a process learn once per scheme object and share."""

    #: the last broadcast state a worker validated against ``scheme.loads``, with its digest:
    #: every worker of a process receives the same state in a round, so the others skip the
    #: O(m) bound check and the hash (each still checks its own entry)
    checked_state: tuple[tuple[int, ...], bytes] | None = None
    #: ``scheme.loads`` and ``scheme.orders`` as Python ints (the hot path indexes them per
    #: chunk), converted once per scheme rather than once per worker and connection
    loads: list[int] | None = None
    orders: list[list[int]] | None = None
    #: ordering="adaptive": the last round_start's flattened orders, the scheme with them
    #: and its orders as lists (every worker of a process gets the same orders in a round)
    round_orders: tuple[tuple[int, ...], Any, list[list[int]]] | None = None


@dataclass
class Setup:
    """What a worker needs for a configuration: the scheme and its gradient function.

    Built by the driver layer (``aiogc.training.setup``), shared by every worker of a process
    that runs the same configuration. ``digest`` is ``scheme_digest(scheme)``, computed here
    when not given (a driver that builds one Setup per worker for one scheme passes it).
    The workers using one Setup share its ``facts``; workers sharing a :class:`WorkerCache`
    share them across the Setups of one scheme object too.
    """

    config: RunConfig
    scheme: Scheme
    chunk_gradient: ChunkGradientFn
    digest: str = ""
    facts: SchemeFacts = field(default_factory=SchemeFacts, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.digest:
            self.digest = scheme_digest(self.scheme)


class WorkerCache:
    """The per-process memory of a group of workers, owned by the driver that creates them.

    * validated configs by the SHA-256 of their canonical bytes (``config_hash``, which the
      welcome MAC covers anyway): the coroutine workers of one process all receive the same
      config, and ``RunConfig.from_wire`` (a full validation) then runs once, not once per
      worker. Equal
      canonical bytes are an equal map, which ``from_wire`` turns into an equal (frozen)
      value; a map it rejects is never stored;
    * per scheme object, its :class:`SchemeFacts` (weakly: a scheme nobody uses any more is
      forgotten).

    Not thread-safe beyond what dict operations are: the workers sharing one run on one loop
    (or one virtual clock).
    """

    def __init__(self) -> None:
        self._configs: dict[bytes, RunConfig] = {}
        self._facts: weakref.WeakKeyDictionary[Any, SchemeFacts] = weakref.WeakKeyDictionary()

    def config(self, chash: bytes, wire: dict[str, Any]) -> RunConfig:
        """``RunConfig.from_wire(wire)``, once per ``chash`` (raises its ConfigError)."""
        config = self._configs.get(chash)
        if config is None:
            config = RunConfig.from_wire(wire)
            if len(self._configs) >= MAX_WIRE_CONFIGS:
                self._configs.clear()
            self._configs[chash] = config
        return config

    def facts(self, setup: Setup) -> SchemeFacts:
        """The facts shared by every worker of this cache that runs ``setup.scheme``."""
        try:
            return self._facts.setdefault(setup.scheme, setup.facts)
        except TypeError:  # a scheme that is not hashable or weak-referenceable
            return setup.facts
