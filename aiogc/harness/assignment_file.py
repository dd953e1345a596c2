"""Reading an assignment matrix from a file (kept out of :mod:`aiogc.coding`, which does no I/O).
"""

from __future__ import annotations

from os import PathLike
from pathlib import Path

import numpy as np

from aiogc.coding.assignments import validate_assignment
from aiogc.errors import CodingError

__all__ = ["load_assignment", "resolve_factor_spec"]


def resolve_factor_spec(spec: str, *, field: str) -> str:
    """A ``--worker-speeds`` / ``--chunk-sizes`` value as the configuration carries it:
    ``file:PATH`` read (numbers separated by commas, blanks or new lines; ``#`` comments) and
    put in canonical run-length form (:func:`aiogc.coding.hetero.canonical_factors`), so
    workers never read a file; any other text unchanged."""
    from aiogc.coding.hetero import canonical_factors, parse_factor_list
    from aiogc.errors import ConfigError

    text = spec.strip()
    if not text.startswith("file:"):
        return spec
    path = Path(text[5:].strip())
    try:
        raw = path.read_text()
    except OSError as exc:
        raise ConfigError(field, spec, f"file:PATH with a readable file ({exc})") from None
    body = "\n".join(line.split("#", 1)[0] for line in raw.splitlines())
    return canonical_factors(parse_factor_list(body, field=field))


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
