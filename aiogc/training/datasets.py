"""Data sets for the learning tasks: CSV, LIBSVM and NPZ loaders, the shipped fixtures
(``builtin``, ``breast-cancer``), and the checks every loaded set passes (finite values, at least
one sample, binary labels).

The ``logreg:`` spec syntax that names these files is in :mod:`aiogc.training.tasks`. Every
failure is a :class:`~aiogc.errors.ConfigError` naming the file (``where``) and what was expected.
"""

from __future__ import annotations

import csv
import importlib.resources
import io
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Final

import numpy as np

from aiogc.errors import ConfigError

__all__ = [
    "BREAST_CANCER",
    "BUILTIN_DATASET",
    "MAX_LIBSVM_FEATURES",
    "binary_labels",
    "check_finite",
    "guess_format",
    "load_breast_cancer",
    "load_csv",
    "load_dataset",
    "load_libsvm",
    "load_npz",
]

#: Resource name of the shipped fixture, inside the ``aiogc.data`` package directory.
BUILTIN_DATASET: Final = "builtin.libsvm"

#: Largest LIBSVM feature index accepted: the matrix is dense, so an index of 10^9 would try to
#: allocate gigabytes; real small data sets stay far below this.
MAX_LIBSVM_FEATURES: Final = 100_000

def _bad_data(where: str, allowed: str) -> ConfigError:
    return ConfigError("task", where, allowed)


def check_finite(X: np.ndarray, y: np.ndarray, where: str) -> None:
    if not (np.isfinite(X).all() and np.isfinite(y).all()):
        raise _bad_data(where, "finite feature and label values (no nan / inf)")
    if X.shape[0] == 0:
        raise _bad_data(where, "at least one sample")


def load_csv(
    lines: Iterable[str], where: str, label: str | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Parse CSV text: numeric columns, an optional header row, ``#`` comment lines.

    Parameters
    ----------
    lines : iterable of str
    where : str
        Name used in errors (usually the path).
    label : str, optional
        Label column: a 0-based index (negative from the end) or a header name; default last.

    Returns
    -------
    X : numpy.ndarray, shape (n, d)
    y : numpy.ndarray, shape (n,)
        Raw label values (see :func:`binary_labels`).

    Raises
    ------
    ConfigError
        Field ``"task"``; the value names the file and line.
    """
    header: list[str] | None = None
    rows: list[list[float]] = []
    width = -1
    for lineno, fields in _csv_records(lines):
        vals: list[float] = []
        try:
            vals = [float(f) for f in fields]
        except ValueError:
            if header is None and not rows and not any(_is_number(f) for f in fields):
                header = [f.strip() for f in fields]
                width = len(header)
                continue
            raise _bad_data(f"{where}:{lineno}", f"numeric fields, got {fields!r}") from None
        if width < 0:
            width = len(vals)
        if len(vals) != width:
            raise _bad_data(f"{where}:{lineno}", f"{width} fields per row, got {len(vals)}")
        rows.append(vals)
    if width < 2:
        raise _bad_data(where, "a CSV file with at least 2 columns (features and a label)")
    if not rows:
        raise _bad_data(where, "at least one data row")
    col = width - 1
    if label is not None:
        if header is not None and label in header:
            col = header.index(label)
        else:
            try:
                col = int(label)
            except ValueError:
                names = "" if header is None else f" or one of {header}"
                raise ConfigError("label", label, f"a column index{names}") from None
            if not -width <= col < width:
                raise ConfigError("label", label, f"a column index in [{-width}, {width - 1}]")
            col %= width
    data = np.array(rows, dtype=np.float64)
    return np.delete(data, col, axis=1), data[:, col]


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _csv_records(lines: Iterable[str]) -> Iterable[tuple[int, list[str]]]:
    for lineno, raw in enumerate(lines, start=1):
        text = raw.strip()
        if not text or text.startswith("#"):
            continue
        yield lineno, next(csv.reader([text]))


def _libsvm_entry(tok: str, at: str) -> tuple[int, float] | None:
    """One ``idx:val`` token as (1-based index, value); ``None`` for a ``qid:`` token."""
    key, colon, val = tok.partition(":")
    if key == "qid":
        return None
    if not colon or not re.fullmatch(r"\d+", key):
        raise _bad_data(at, f"idx:val tokens with an integer idx >= 1, got {tok!r}")
    idx = int(key)
    if not 1 <= idx <= MAX_LIBSVM_FEATURES:
        raise _bad_data(at, f"feature index in [1, {MAX_LIBSVM_FEATURES}], got {idx}")
    try:
        v = float(val)
    except ValueError:
        raise _bad_data(at, f"a numeric value in {tok!r}") from None
    return idx, v


def load_libsvm(
    lines: Iterable[str], where: str, n_features: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Parse LIBSVM / svmlight text: ``label idx:val ...`` with 1-based indices.

    Parameters
    ----------
    lines : iterable of str
    where : str
        Name used in errors.
    n_features : int, optional
        Number of columns d; default the largest index seen.

    Returns
    -------
    X : numpy.ndarray, shape (n, d)
        Dense; missing entries are 0.
    y : numpy.ndarray, shape (n,)
        Raw labels.

    Raises
    ------
    ConfigError
        Field ``"task"``; the value names the file and line.
    """
    labels: list[float] = []
    entries: list[tuple[int, int, float]] = []
    max_idx = 0
    for lineno, raw in enumerate(lines, start=1):
        text = raw.split("#", 1)[0].strip()
        if not text:
            continue
        at = f"{where}:{lineno}"
        tokens = text.split()
        try:
            labels.append(float(tokens[0]))
        except ValueError:
            raise _bad_data(at, f"a numeric label first, got {tokens[0]!r}") from None
        row = len(labels) - 1
        for tok in tokens[1:]:
            entry = _libsvm_entry(tok, at)
            if entry is None:
                continue
            idx, v = entry
            entries.append((row, idx - 1, v))
            max_idx = max(max_idx, idx)
    if not labels:
        raise _bad_data(where, "at least one 'label idx:val ...' line")
    d = max_idx if n_features is None else n_features
    if d < max_idx:
        raise ConfigError("n_features", d, f">= {max_idx}, the largest index in {where}")
    if d < 1:
        raise _bad_data(where, "at least one feature")
    X = np.zeros((len(labels), d))
    for r, c, v in entries:
        X[r, c] = v
    return X, np.array(labels)


def load_npz(
    source: str | os.PathLike[str] | io.BytesIO, where: str
) -> tuple[np.ndarray, np.ndarray]:
    """Load arrays ``X`` (n, d) and ``y`` (n,) from an ``.npz`` file (no pickles).

    Returns
    -------
    X : numpy.ndarray, shape (n, d)
    y : numpy.ndarray, shape (n,)

    Raises
    ------
    ConfigError
        Unreadable archive, missing arrays or wrong shapes.
    """
    try:
        with np.load(source, allow_pickle=False) as z:
            if "X" not in z.files or "y" not in z.files:
                raise _bad_data(where, f"an .npz with arrays 'X' and 'y', found {z.files}")
            X = np.asarray(z["X"], dtype=np.float64)
            y = np.asarray(z["y"], dtype=np.float64)
    except ConfigError:
        raise
    except (ValueError, OSError, TypeError) as exc:
        raise _bad_data(where, f"a readable .npz archive ({exc})") from None
    if X.ndim != 2 or y.ndim != 1 or X.shape[0] != y.shape[0]:
        raise _bad_data(where, f"X of shape (n, d) and y of shape (n,), got {X.shape}, {y.shape}")
    return X, y


def binary_labels(y: np.ndarray, where: str) -> np.ndarray:
    """Map two label values to {0, 1} (smaller -> 0); a single value must be 0, 1 or -1."""
    values = np.unique(y)
    if values.size > 2:
        shown = values[:5].tolist()
        raise _bad_data(where, f"binary labels (two distinct values), found {shown}...")
    if values.size == 2:
        labels: np.ndarray = (y == values[1]).astype(np.float64)
        return labels
    if values[0] in (0.0, -1.0):
        return np.zeros_like(y)
    if values[0] == 1.0:
        return np.ones_like(y)
    raise _bad_data(where, f"labels in {{0, 1}} or {{-1, +1}}, found only {values[0]!r}")



#: ``logreg:breast-cancer``: the Wisconsin diagnostic breast-cancer data (569 x 30, shipped in
#: aiogc/data with its provenance and licence in aiogc/data/README.md).
BREAST_CANCER: Final = "breast-cancer"
BREAST_CANCER_FILE: Final = "breast_cancer.csv"


def load_breast_cancer() -> tuple[np.ndarray, np.ndarray]:
    """The shipped Wisconsin diagnostic breast-cancer data, features standardised.

    Returns
    -------
    X : ndarray of float64, shape (569, 30)
        Every feature shifted and scaled to mean 0 and standard deviation 1 over the data set
        (the raw features span five orders of magnitude, which would make plain gradient descent
        with step 1/L crawl).
    y : ndarray of float64, shape (569,)
        1 = benign, 0 = malignant (the file's own coding).
    """
    where = f"aiogc/data/{BREAST_CANCER_FILE}"
    text = importlib.resources.files("aiogc").joinpath("data", BREAST_CANCER_FILE).read_text()
    lines = text.splitlines()
    if not lines or lines[0].split(",")[:2] != ["569", "30"]:
        raise _bad_data(where, "the shipped file with header '569,30,malignant,benign'")
    data = np.array([[float(v) for v in ln.split(",")] for ln in lines[1:] if ln.strip()])
    if data.shape != (569, 31):
        raise _bad_data(where, "569 rows of 30 features and a label")
    X, y = data[:, :30], data[:, 30]
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    return X, y


def guess_format(path: str) -> str:
    low = path.lower()
    if low.endswith(".npz"):
        return "npz"
    if low.endswith(".csv"):
        return "csv"
    return "libsvm"



def load_dataset(path_text: str, fmt: str | None, label: str | None, spec: str
                 ) -> tuple[np.ndarray, np.ndarray, str, str]:
    """The logreg data set named by ``path_text``: ``(X, raw labels, name used in errors,
    canonical path)``; ``fmt`` None guesses it from the extension, ``label`` is the CSV label
    column (``label=``), ``spec`` the task spec errors name."""
    if path_text == BREAST_CANCER:
        where = f"aiogc/data/{BREAST_CANCER_FILE}"
        X, y_raw = load_breast_cancer()
        canonical_path = BREAST_CANCER
    elif path_text == "builtin":
        where = f"aiogc/data/{BUILTIN_DATASET}"
        text = importlib.resources.files("aiogc").joinpath("data", BUILTIN_DATASET).read_text()
        X, y_raw = load_libsvm(text.splitlines(), where)
        canonical_path = "builtin"
    else:
        path = Path(path_text).expanduser()
        canonical_path = os.path.abspath(path)
        where = str(path)
        fmt = fmt or guess_format(path_text)
        if not path.is_file():
            raise ConfigError("task", spec, f"logreg:PATH with PATH an existing file ({where})")
        if fmt == "npz":
            X, y_raw = load_npz(path, where)
        else:
            try:
                with open(path, encoding="utf-8") as fh:
                    if fmt == "csv":
                        X, y_raw = load_csv(fh, where, label)
                    else:
                        X, y_raw = load_libsvm(fh, where)
            except UnicodeDecodeError:
                raise _bad_data(where, f"a UTF-8 text {fmt} file") from None
    return X, y_raw, where, canonical_path
