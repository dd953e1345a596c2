"""The registry of chunk processing orders (``--ordering NAME``), like the schemes'
(:mod:`aiogc.coding.registry`): adding an ordering is one :func:`register_ordering` call in
this file, from which the configuration's check, every scheme that takes an order, the
``--ordering`` help and the error listing the known names follow.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from aiogc.coding.hetero import hetero_order
from aiogc.coding.orderings import natural_order, random_order, validate_orders
from aiogc.errors import CodingError, ConfigError

__all__ = ["OrderingSpec", "build_orders", "ordering_help", "ordering_names", "ordering_spec",
           "register_ordering"]



@dataclass(frozen=True)
class OrderingSpec:
    """One processing order a configuration may name (``--ordering NAME``).

    Attributes
    ----------
    name : str
    build : callable
        ``build(A, n_parts, rng, speeds, sizes) -> orders``: ``A`` (N, m) 0/1, ``n_parts`` the
        scheme's ℓ, ``rng`` the scheme's generator, ``speeds`` (m,) / ``sizes`` (N,) relative
        worker speeds / chunk sizes or None when uniform; returns m int64 arrays
        (:func:`validate_orders` checks them).
    help : str
        One line for ``--help`` and the docs.
    static : bool
        The order is fixed before training (every scheme that takes an order accepts it);
        False: only schemes that change orders between rounds (``adaptive``, whose ``build``
        is the starting order).
    """

    name: str
    build: Callable[[np.ndarray, int, np.random.Generator, np.ndarray | None,
                     np.ndarray | None], list[np.ndarray]]
    help: str
    static: bool = True


_ORDERINGS: dict[str, OrderingSpec] = {}


def register_ordering(spec: OrderingSpec) -> OrderingSpec:
    """Add ``spec`` to the orderings every scheme, the configuration and the command line
    know (an existing name is a CodingError)."""
    if spec.name in _ORDERINGS:
        raise CodingError(f"ordering {spec.name!r} is already registered")
    _ORDERINGS[spec.name] = spec
    return spec


def ordering_names(*, static: bool = False) -> tuple[str, ...]:
    """The registered orderings, in registration order (``static``: the fixed ones only)."""
    return tuple(n for n, s in _ORDERINGS.items() if s.static or not static)


def ordering_spec(name: str) -> OrderingSpec:
    """The registry entry of ``name``; ConfigError listing the known ones otherwise."""
    spec = _ORDERINGS.get(name)
    if spec is None:
        raise ConfigError("ordering", name, "one of " + ", ".join(_ORDERINGS))
    return spec


def ordering_help() -> str:
    """``NAME: help; ...`` for every registered ordering (``--ordering``'s help text)."""
    return "; ".join(f"{s.name}: {s.help}" for s in _ORDERINGS.values())


def build_orders(name: str, A: np.ndarray, n_parts: int, rng: np.random.Generator,
                 speeds: np.ndarray | None = None, sizes: np.ndarray | None = None
                 ) -> list[np.ndarray]:
    """The orders of ordering ``name`` for assignment ``A`` (m int64 arrays, validated)."""
    return validate_orders(A, ordering_spec(name).build(A, n_parts, rng, speeds, sizes))


def _optimal(A: np.ndarray, n_parts: int, rng: np.random.Generator,
             speeds: np.ndarray | None, sizes: np.ndarray | None) -> list[np.ndarray]:
    return hetero_order(A, n_parts, rng, speeds, sizes)


register_ordering(OrderingSpec(
    "optimal", _optimal,
    "the Q_max-minimising order (on a heterogeneous cluster: also the speed-aware candidate, "
    "whichever covers sooner)"))
register_ordering(OrderingSpec(
    "natural", lambda A, n_parts, rng, speeds, sizes: natural_order(A),
    "each worker's chunks in increasing index"))
register_ordering(OrderingSpec(
    "random", lambda A, n_parts, rng, speeds, sizes: random_order(A, rng),
    "a random permutation per worker, from the seed"))
register_ordering(OrderingSpec(
    "adaptive", _optimal,
    "partial: speed-aware orders chosen by the PS each round, starting from optimal "
    "(aiogc.coding.adaptive)", static=False))
