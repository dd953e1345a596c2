"""Round statuses and end reasons: closed vocabularies instead of free strings.

Both are :class:`enum.StrEnum`, so a member compares equal to its value and is written to
``rounds.csv`` as that value; :meth:`RoundStatus.parse` / :meth:`EndReason.parse` read them
back with a clear error for anything else. Only the public outcomes appear in a
:class:`~aiogc.core.RoundRecord`; the PS keeps "an approximate trigger is pending" as its own
internal state, never as a status.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TypeVar

from aiogc.errors import ConfigError

__all__ = ["EndReason", "RoundStatus", "describe_end"]

_E = TypeVar("_E", bound="_Vocabulary")

#: The record field each vocabulary fills (named in parse errors).
_FIELD = {"RoundStatus": "status", "EndReason": "end_reason"}


class _Vocabulary(StrEnum):
    @classmethod
    def parse(cls: type[_E], value: str) -> _E:
        """The member whose value is ``value``; ConfigError naming the allowed values."""
        try:
            return cls(value)
        except ValueError:
            raise ConfigError(_FIELD[cls.__name__], value,
                              "one of " + ", ".join(m.value for m in cls)) from None


class RoundStatus(_Vocabulary):
    """How a round ended (``RUNNING`` until it does)."""

    RUNNING = "running"
    EXACT = "exact"
    APPROXIMATE = "approximate"
    FAILED = "failed"


class EndReason(_Vocabulary):
    """Why a round ended (the code; details such as which workers went away are separate).

    Decoded rounds: ``DECODABLE`` (the waiting rule was met), ``ALL_EXPECTED`` (every vector
    the trigger asked for arrived), ``NO_CONTRIBUTORS`` (an approximate trigger with nobody to
    wait for), ``DEADLINE`` (approx mode), ``ROUND_TIMEOUT`` (approx mode, send-when-done).
    Failed rounds: ``WORKERS_GONE`` (the remaining workers cannot decode), ``NOTHING_COMPUTED``
    (nothing to decode at the deadline or after losses), ``TIMEOUT`` (no decode within
    ``round_timeout_s``), ``NONFINITE`` (the decoded gradient was not finite), ``REJECTED``
    (the round guard refused the decoded step: a consistency or verification check failed),
    ``PS_STALL`` (workers were lost while the PS itself had stalled: the PS's fault, not theirs).
    """

    DECODABLE = "decodable"
    ALL_EXPECTED = "all_expected"
    NO_CONTRIBUTORS = "no_contributors"
    DEADLINE = "deadline"
    ROUND_TIMEOUT = "round_timeout"
    WORKERS_GONE = "workers_gone"
    NOTHING_COMPUTED = "nothing_computed"
    TIMEOUT = "timeout"
    NONFINITE = "nonfinite"
    REJECTED = "rejected"
    PS_STALL = "ps_stall"


def describe_end(reason: object, detail: object = "") -> str:
    """One human line for an end reason and its detail: ``"detail (code)"``, the code alone
    when there is no detail, ``"no reason given"`` when there is neither."""
    code = "" if reason is None else str(reason)
    text = "" if detail is None else str(detail)
    if text and code:
        return f"{text} ({code})"
    return text or code or "no reason given"
