"""Reading an assignment matrix from a file (kept out of :mod:`aiogc.coding`, which does no I/O).
"""

from __future__ import annotations

from os import PathLike
from pathlib import Path

import numpy as np

from aiogc.coding.assignments import validate_assignment
from aiogc.errors import CodingError

__all__ = ["load_assignment"]


def load_assignment(path: str | PathLike[str]) -> np.ndarray:
    """Load an assignment from ``.npy`` or ``.csv`` (comma separated 0/1, one chunk per row).

    Returns
    -------
    A : ndarray of bool, shape (N, m)
    """
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix == ".npy":
        M = np.load(p, allow_pickle=False)
    elif suffix == ".csv":
        try:
            M = np.loadtxt(p, delimiter=",", ndmin=2)
        except ValueError as exc:
            raise CodingError(f"cannot parse assignment CSV {str(p)!r}: {exc}") from exc
    else:
        raise CodingError(f"assignment file {str(p)!r}: suffix {suffix!r} not in ('.csv', '.npy')")
    return validate_assignment(M)
