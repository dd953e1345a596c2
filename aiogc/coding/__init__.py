"""The numerical coding library: assignments, orderings, decoding matrices, schemes.

numpy/scipy only; no I/O, no clock, randomness only through ``rng: np.random.Generator``
arguments. Speaks ndarrays and knows no messages. Every scheme implements :class:`Scheme`
and is declared once in the registry (:mod:`aiogc.coding.registry`).
"""

from aiogc.coding.assignments import (
    assignment_from_matrix,
    cyclic_assignment,
    fractional_repetition_assignment,
    is_cyclic,
    is_fractional_repetition,
    is_regular,
    regular_assignment,
    validate_assignment,
)
from aiogc.coding.base import DecodeResult, Scheme, SchemeBase, TrustedDecoder, TrustedEncoder

# Scheme modules register themselves on import, and the registry keeps registration order
# (scheme_names(): the CLI's default comparison, the help texts), so these imports are in that
# order, not sorted: the paper's scheme first, then the baselines. A new scheme module is one
# more import here (tests/test_scheme_capabilities.py pins the order).
# isort: split
from aiogc.coding.partial import PartialScheme

# isort: split
from aiogc.coding.baselines import (
    IgnoreStragglersScheme,
    OriginalScheme,
    UncodedScheme,
)

# isort: split
from aiogc.coding.stream import StreamChunksScheme

# isort: split
from aiogc.coding.decoding_matrix import (
    check_conditioning,
    colour_workers,
    decoding_matrix,
    worst_condition_number,
)
from aiogc.coding.ordering_registry import OrderingSpec, ordering_names, register_ordering
from aiogc.coding.orderings import (
    natural_order,
    optimal_order,
    positions,
    q_max,
    q_max_bruteforce,
    q_max_per_chunk,
    random_order,
)
from aiogc.coding.registry import (
    ASSIGNMENTS,
    DECODINGS,
    SchemeChoices,
    SchemeParams,
    SchemeSpec,
    build_assignment,
    make_scheme,
    register_scheme,
    scheme_names,
    scheme_spec,
    sends_when_done,
    spec_of_label,
    unregister_scheme,
)

__all__ = [
    "ASSIGNMENTS",
    "DECODINGS",
    "DecodeResult",
    "IgnoreStragglersScheme",
    "OrderingSpec",
    "OriginalScheme",
    "PartialScheme",
    "Scheme",
    "SchemeBase",
    "SchemeChoices",
    "SchemeParams",
    "SchemeSpec",
    "StreamChunksScheme",
    "TrustedDecoder",
    "TrustedEncoder",
    "UncodedScheme",
    "assignment_from_matrix",
    "build_assignment",
    "check_conditioning",
    "colour_workers",
    "cyclic_assignment",
    "decoding_matrix",
    "fractional_repetition_assignment",
    "is_cyclic",
    "is_fractional_repetition",
    "is_regular",
    "make_scheme",
    "natural_order",
    "optimal_order",
    "ordering_names",
    "positions",
    "q_max",
    "q_max_bruteforce",
    "q_max_per_chunk",
    "random_order",
    "register_ordering",
    "register_scheme",
    "regular_assignment",
    "scheme_names",
    "scheme_spec",
    "sends_when_done",
    "spec_of_label",
    "unregister_scheme",
    "validate_assignment",
    "worst_condition_number",
]
