"""Reading the files of a run directory that may be hostile or corrupt, within bounds.

Every reader of a run directory (``load_run``, ``aiogc.load_run``, ``aiogc report`` /
``inspect`` / ``whatif`` / ``plot``) reads its JSON and CSV files through these, so that a
file written by someone else ends in one :class:`RunFileError` naming the file, the line and
column or field, the value and what was expected, in bounded time and memory:

* a JSON file is at most :data:`MAX_JSON_BYTES`, strict JSON (no NaN / Infinity), nested at
  most :data:`MAX_JSON_DEPTH` levels, and the expected top-level type;
* a CSV cell is at most :data:`MAX_CELL_CHARS` characters and parses as its column's type;
  a time (a column ending in ``_s``, or ``t_start`` / ``t_trigger`` / ``ps_time``...) is
  finite and within :data:`MAX_TIME_S` seconds (NaN stands for "none");
* an ``events.jsonl`` line is at most :data:`MAX_EVENT_LINE_CHARS` and a JSON object.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

from aiogc.errors import ConfigError

__all__ = [
    "MAX_CELL_CHARS",
    "MAX_EVENT_LINE_CHARS",
    "MAX_JSON_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_TIME_S",
    "RunFileError",
    "check_event",
    "is_time_column",
    "read_csv_rows",
    "read_json",
]

#: Largest manifest.json / summary.json read (a 1024-worker run's summary is well under 1 MiB).
MAX_JSON_BYTES: Final = 64 << 20
#: Deepest nesting of a run's JSON (the writers nest a handful of levels).
MAX_JSON_DEPTH: Final = 64
#: Longest CSV cell (a state or weight row of a 65536-chunk run fits).
MAX_CELL_CHARS: Final = 4 << 20
#: Longest events.jsonl line (a run event with its extra fields).
MAX_EVENT_LINE_CHARS: Final = 1 << 20
#: Largest magnitude of a recorded time, in seconds (about 32 years).
MAX_TIME_S: Final = 1e9

_TIME_NAMES: Final = frozenset({"t_start", "t_trigger", "t_decoded", "ps_time", "t_ns"})


class RunFileError(ConfigError):
    """A file of a run directory is not what aiogc writes: the message names the file, where
    in it (line, column or field), the value and what was expected."""

    def __init__(self, path: Path | str, where: str, what: str) -> None:
        self.path = str(path)
        self.where = where
        place = f"{path}" + (f", {where}" if where else "")
        ValueError.__init__(self, f"{place}: {what}")
        self.field, self.value, self.allowed = where or str(path), None, what


def _short(value: str, n: int = 60) -> str:
    return repr(value if len(value) <= n else value[:n] + "...")


def is_time_column(name: str) -> bool:
    """Whether a CSV column holds seconds (or a time stamp) that must be finite."""
    return name.endswith("_s") or name in _TIME_NAMES


def _depth_ok(obj: Any, limit: int) -> bool:
    """Nesting of ``obj`` at most ``limit`` (iterative: no recursion on hostile input)."""
    stack: list[tuple[Any, int]] = [(obj, 1)]
    while stack:
        o, d = stack.pop()
        if isinstance(o, dict | list):
            if d > limit:
                return False
            stack.extend((v, d + 1) for v in (o.values() if isinstance(o, dict) else o))
    return True


def _no_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name} (run files are strict JSON)")


def read_json(path: Path, *, kind: type = dict) -> Any:
    """The JSON value of ``path``, checked (module docstring); ``kind`` its top-level type."""
    try:
        size = path.stat().st_size
        if size > MAX_JSON_BYTES:
            raise RunFileError(path, "", f"{size} bytes, larger than the {MAX_JSON_BYTES} "
                               "bytes a run's JSON file may be")
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RunFileError(path, f"byte {exc.start}", "not UTF-8 text") from None
    except OSError as exc:
        raise RunFileError(path, "", f"cannot be read ({exc.strerror or exc})") from None
    try:
        obj = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise RunFileError(path, "", f"nested deeper than {MAX_JSON_DEPTH} levels") from None
    except json.JSONDecodeError as exc:
        raise RunFileError(path, f"line {exc.lineno}, column {exc.colno}",
                           f"not JSON ({exc.msg})") from None
    except ValueError as exc:
        raise RunFileError(path, "", str(exc)) from None
    if not _depth_ok(obj, MAX_JSON_DEPTH):
        raise RunFileError(path, "", f"nested deeper than {MAX_JSON_DEPTH} levels")
    if not isinstance(obj, kind):
        raise RunFileError(path, "top level", f"a JSON {kind.__name__}, not "
                           f"{type(obj).__name__}")
    return obj


def check_event(path: Path, lineno: int, line: str) -> Any:
    """One ``events.jsonl`` line as a dict; None for a line that is not complete JSON (a run
    cut short mid-line); :class:`RunFileError` for a line no writer makes."""
    if len(line) > MAX_EVENT_LINE_CHARS:
        raise RunFileError(path, f"line {lineno}", f"{len(line)} characters, longer than "
                           f"the {MAX_EVENT_LINE_CHARS} an event line may be")
    try:
        ev = json.loads(line, parse_constant=_no_constant)
    except RecursionError:
        raise RunFileError(path, f"line {lineno}",
                           f"nested deeper than {MAX_JSON_DEPTH} levels") from None
    except json.JSONDecodeError:
        return None
    except ValueError as exc:
        raise RunFileError(path, f"line {lineno}", str(exc)) from None
    if not isinstance(ev, dict):
        raise RunFileError(path, f"line {lineno}", f"a JSON object, not {type(ev).__name__}")
    if not _depth_ok(ev, MAX_JSON_DEPTH):
        raise RunFileError(path, f"line {lineno}", f"nested deeper than {MAX_JSON_DEPTH} levels")
    return ev


@contextlib.contextmanager
def _cell_limit() -> Iterator[None]:
    old = csv.field_size_limit()
    csv.field_size_limit(MAX_CELL_CHARS)
    try:
        yield
    finally:
        csv.field_size_limit(old)


def read_csv_rows(path: Path, text: str, types: dict[str, type],
                  parse: Callable[[type, str], Any]) -> list[dict[str, Any]]:
    """The rows of a run's CSV ``text`` (read from ``path``), each cell parsed by
    ``parse(types[column], cell)`` and checked (module docstring)."""
    rows = []
    with _cell_limit():
        reader = csv.DictReader(io.StringIO(text, newline=""))
        try:
            for row in reader:
                out = {}
                for k, v in row.items():
                    if k is None or v is None:
                        raise RunFileError(path, f"line {reader.line_num}",
                                           f"{len(row)} cells, not the header's "
                                           f"{len(reader.fieldnames or [])}")
                    kind = types.get(k, str)
                    try:
                        x = parse(kind, v)
                    except (ValueError, OverflowError):
                        raise RunFileError(path, f"line {reader.line_num}, column {k}",
                                           f"{_short(v)} is not a {_kind_name(kind)}"
                                           ) from None
                    if isinstance(x, float) and is_time_column(k) and not (
                            math.isnan(x) or abs(x) <= MAX_TIME_S):
                        raise RunFileError(path, f"line {reader.line_num}, column {k}",
                                           f"{_short(v)} is not a time within "
                                           f"±{MAX_TIME_S:g} s")
                    out[k] = x
                rows.append(out)
        except csv.Error as exc:
            raise RunFileError(path, f"line {reader.line_num}",
                               f"not CSV as aiogc writes it ({exc}; a cell may have at most "
                               f"{MAX_CELL_CHARS} characters)") from None
    return rows


def _kind_name(kind: type) -> str:
    return {int: "integer", float: "number", tuple: "list of integers",
            list: "list of numbers"}.get(kind, kind.__name__)
