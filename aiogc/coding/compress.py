"""Compressed coded payloads: float16 and bfloat16 uploads, decoded in float64.

A worker rounds its coded vector (computed in the run's ``dtype``, float64 or float32) to a
16-bit type before it uploads it; the PS widens every received row to float64 before it
decodes. Only the coded upload changes: the model broadcast, the workers' gradients and the
decode stay in their own precision.

* ``float16`` (IEEE binary16, ``<f2`` on the wire): 11-bit significand, unit roundoff
  ``u = 2^-11``, largest finite value 65504. A coded entry beyond that range becomes inf and the
  PS refuses the vector (non-finite payload), so float16 is for gradients of moderate size.
* ``bfloat16``: the upper 16 bits of an IEEE float32 (8-bit significand, ``u = 2^-8``, float32's
  range). numpy has no bfloat16 dtype: the wire carries the 16-bit words as ``<u2`` (little
  endian, like every array) and :func:`widen` shifts them back into the upper half of a float32.
  The worker rounds to nearest, ties to even, from float32 (a float64 vector is first rounded to
  float32: the double rounding adds at most ``2^-24`` relative, kept in :func:`unit_roundoff`).

The rounding bound (docs/coding.md, "Compressed payloads"). The decode is linear in the payloads,
``g_hat[u] = sum_j D[u, j] v_j`` with the decoding coefficients ``D`` (ell, m) of the round's
state. Each received entry is ``v~ = v (1 + e) + h`` with ``|e| <= u`` and ``|h| <= eta`` (half
the smallest subnormal: float16's subnormals lose relative precision below 6.1e-5; bfloat16's
``eta = 2^-134 + 2^-150`` adds float32's floor for the first of its two roundings), so,
entry by entry,

    ``|g_hat~ - g_hat| <= |D| (u |V~| / (1 - u) + eta)``

and the norm of that vector, :func:`rounding_bound`, bounds what the compression can add to the
decode error (the float64 decode adds round-off of order ``eps64``, negligible beside it). The PS
computes it from what it received, every compressed round, without the workers' data.
"""

from __future__ import annotations

import math
from typing import Final

import numpy as np

__all__ = [
    "CODED_DTYPES",
    "coded_eps",
    "rounding_bound",
    "to_coded",
    "unit_roundoff",
    "widen",
    "wire_dtype",
]

#: ``coded_dtype`` values: ``same`` uploads in the run's ``dtype`` (the default, no rounding).
CODED_DTYPES: Final = ("same", "float16", "bfloat16")

_BF16_EPS: Final = 2.0**-7
#: the absolute rounding floor: half the smallest positive subnormal of each 16-bit type;
#: bfloat16 adds float32's (``2^-150``): a float64 entry is first rounded to float32, whose
#: subnormals can lose up to ``2^-150`` before the bfloat16 rounding loses up to ``2^-134``
_ETA: Final = {"float16": 2.0**-25, "bfloat16": 2.0**-134 + 2.0**-150}


def wire_dtype(coded: str, payload_dtype: np.dtype) -> np.dtype:
    """The dtype of the coded rows on the wire and in the PS's buffer.

    ``same``: ``payload_dtype``; ``float16``: ``<f2``; ``bfloat16``: ``<u2`` (bfloat16 bits).
    """
    if coded == "same":
        return np.dtype(payload_dtype)
    if coded == "float16":
        return np.dtype("<f2")
    if coded == "bfloat16":
        return np.dtype("<u2")
    raise ValueError(f"coded dtype {coded!r} not in {CODED_DTYPES}")


def coded_eps(coded: str, payload_dtype: np.dtype) -> float:
    """Machine epsilon of the coded upload (2^-10 float16, 2^-7 bfloat16, else the dtype's)."""
    if coded == "bfloat16":
        return _BF16_EPS
    return float(np.finfo(wire_dtype(coded, payload_dtype)).eps)


def unit_roundoff(coded: str, payload_dtype: np.dtype) -> float:
    """``u``: the largest relative rounding of one coded entry (round to nearest).

    bfloat16 adds float32's ``2^-24`` for the double rounding float64 -> float32 -> bfloat16.
    """
    u = coded_eps(coded, payload_dtype) / 2
    if coded == "bfloat16":
        u += float(np.finfo(np.float32).eps) / 2
    return u


def to_coded(vec: np.ndarray, coded: str) -> np.ndarray:
    """Round a coded vector to its upload type; a fresh contiguous 1-D array.

    Parameters
    ----------
    vec : ndarray, shape (p,)
        The coded vector (float64 or float32).
    coded : {"float16", "bfloat16"}

    Returns
    -------
    ndarray of ``<f2`` or ``<u2`` (bfloat16 bits), shape (p,)
    """
    if coded == "float16":
        return np.ascontiguousarray(vec, dtype="<f2")
    if coded != "bfloat16":
        raise ValueError(f"to_coded: {coded!r} is not a 16-bit coded dtype")
    bits = np.ascontiguousarray(vec, dtype="<f4").view("<u4")
    # round to nearest, ties to even: add 0x7FFF plus the lowest kept bit, keep the upper half
    # (a carry out of the significand correctly rounds up into the exponent, to inf at the top)
    rounded = (bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))))
    out: np.ndarray = (rounded >> np.uint32(16)).astype("<u2")
    nan = np.isnan(vec)
    if nan.any():  # a NaN's low bits could carry it into inf: keep it a quiet NaN
        out[nan] = 0x7FC0
    return out


def widen(rows: np.ndarray, coded: str) -> np.ndarray:
    """Received coded rows as float64, for the decode; shape kept (``(m, p)`` or ``(p,)``)."""
    if coded == "bfloat16":
        out: np.ndarray = (rows.astype(np.uint32) << np.uint32(16)).view(np.float32)
        return out.astype(np.float64)
    return rows.astype(np.float64)


def rounding_bound(D: np.ndarray, rows64: np.ndarray, coded: str,
                   payload_dtype: np.dtype) -> float:
    """Bound on ``||g_hat~ - g_hat||``: what rounding the payloads can add to the decode.

    Parameters
    ----------
    D : ndarray, shape (ell, m)
        The decoding coefficients of the round's state (zero for unused workers).
    rows64 : ndarray, shape (m, p)
        The received payloads, widened to float64 (rows of unused workers are not read).
    coded : {"float16", "bfloat16"}
    payload_dtype : numpy dtype
        The run's dtype (float32 / float64).

    Returns
    -------
    float
        ``|| |D| (u |V~| / (1 - u) + eta) ||`` over the ``ell * p`` decoded entries.
    """
    u = unit_roundoff(coded, payload_dtype)
    eta = _ETA.get(coded, 0.0)
    used = np.flatnonzero(np.abs(D).sum(axis=0) > 0)
    if used.size == 0:
        return 0.0
    A = np.abs(D[:, used])
    per = A @ (np.abs(rows64[used]) * (u / (1.0 - u)) + eta)
    return float(math.sqrt(float(np.sum(per * per))))
