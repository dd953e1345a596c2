"""The numerical coding library: assignments, orderings, decoding matrices, schemes.

numpy/scipy only; no I/O, no clock, randomness only through ``rng: np.random.Generator``
arguments. Speaks ndarrays and knows no messages. Every scheme implements :class:`Scheme`.
"""

from aiogc.coding.assignments import (
    assignment_from_matrix,
    cyclic_assignment,
    fractional_repetition_assignment,
    is_cyclic,
    is_fractional_repetition,
    is_regular,
    load_assignment,
    regular_assignment,
    validate_assignment,
)
from aiogc.coding.base import DecodeResult, Scheme
from aiogc.coding.baselines import (
    SCHEME_NAMES,
    IgnoreStragglersScheme,
    OriginalScheme,
    UncodedScheme,
    make_scheme,
)
from aiogc.coding.decoding_matrix import (
    check_conditioning,
    colour_workers,
    decoding_matrix,
    worst_condition_number,
)
from aiogc.coding.orderings import (
    natural_order,
    optimal_order,
    positions,
    q_max,
    q_max_bruteforce,
    q_max_per_chunk,
    random_order,
)
from aiogc.coding.partial import PartialScheme

__all__ = [
    "SCHEME_NAMES",
    "DecodeResult",
    "IgnoreStragglersScheme",
    "OriginalScheme",
    "PartialScheme",
    "Scheme",
    "UncodedScheme",
    "assignment_from_matrix",
    "check_conditioning",
    "colour_workers",
    "cyclic_assignment",
    "decoding_matrix",
    "fractional_repetition_assignment",
    "is_cyclic",
    "is_fractional_repetition",
    "is_regular",
    "load_assignment",
    "make_scheme",
    "natural_order",
    "optimal_order",
    "positions",
    "q_max",
    "q_max_bruteforce",
    "q_max_per_chunk",
    "random_order",
    "regular_assignment",
    "validate_assignment",
    "worst_condition_number",
]
