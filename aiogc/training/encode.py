"""The worker driver's half of encoding: run the worker core's
:class:`~aiogc.core.EncodeVector` work item.

The core decided that the worker sends and with which coefficients; this module does the
numbers: the coded vector of the stored chunk gradients, in the run's payload dtype, rounded
to its 16-bit upload type when ``coded_dtype`` asks for one. Every worker driver (asyncio,
virtual clock) answers the item with ``worker.encode_done(item, encode_vector(item, config))``.
"""

from __future__ import annotations

import numpy as np

from aiogc.coding.base import encode_rows
from aiogc.coding.compress import to_coded
from aiogc.config import RunConfig
from aiogc.core import EncodeVector

__all__ = ["encode_vector"]


def encode_vector(item: EncodeVector, config: RunConfig) -> np.ndarray:
    """The coded vector ``item`` asks for, ready to upload.

    Parameters
    ----------
    item : EncodeVector
        ``grads``: c chunk gradients of shape (d,), positions 0..c-1 of the worker's order.
    config : RunConfig
        Its ``payload_dtype`` and ``coded_dtype`` (16-bit upload type, or ``"same"``).

    Returns
    -------
    ndarray, shape (p,)
        Contiguous, of ``config.coded_wire_dtype``.
    """
    X = np.array(item.grads, dtype=np.float64)  # (c, d): a fresh contiguous copy
    if item.theta is not None:
        # send-when-done: the coefficients do not depend on the state (computed once)
        if item.coef is not None:
            vec = item.coef.dot(X)  # encode_rows' product for ell = 1, no checks
        else:
            vec = encode_rows(item.theta, X, item.scheme.n_parts)
    elif item.fast is not None:
        vec = item.fast(item.worker, item.state, X)
    else:
        vec = item.scheme.encode(item.worker, np.asarray(item.state, dtype=np.int64), X)
    dt = config.payload_dtype
    # the encoders' products are fresh, contiguous float64 vectors: converting them only
    # when the payload dtype differs saves a numpy call per vector
    out = vec if vec.dtype is dt and vec.flags.c_contiguous else (
        np.ascontiguousarray(vec, dtype=dt))
    if config.coded_dtype != "same":  # rounded from the run's dtype for the upload
        out = to_coded(out, config.coded_dtype)
    return out
