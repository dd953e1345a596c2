"""State diagrams and kind tables drawn from the cores' rule tables, never by hand.

The PS's phases and transitions are :data:`aiogc.core.ps_rules.TRANSITIONS`, what each kind of
frame does in each phase is ``ps.RULES``; the worker's are
:data:`aiogc.core.worker_rules.TRANSITIONS` and ``worker.ACCEPTS``. This module renders them as
Mermaid state diagrams and Markdown tables; ``docs/state-machines.md`` is its output
(``python -m aiogc.core.diagram > docs/state-machines.md``) and ``docs/protocol.md`` §5 embeds
the two diagrams. ``tests/test_state_diagrams.py`` fails when either file differs from what
the tables say now.
"""

from __future__ import annotations

from aiogc.core import ps as _ps
from aiogc.core import worker as _worker
from aiogc.core.ps_rules import TRANSITIONS as PS_TRANSITIONS
from aiogc.core.ps_rules import PSPhase
from aiogc.core.worker_rules import TRANSITIONS as WORKER_TRANSITIONS
from aiogc.core.worker_rules import WorkerPhase

__all__ = ["ps_kind_table", "ps_mermaid", "render_page", "worker_kind_table", "worker_mermaid"]


def _label(text: str) -> str:
    """An edge label Mermaid reads as one label (no statement separators, no colons)."""
    return text.replace(";", ",").replace(":", " -").replace("#", "")


def ps_mermaid() -> str:
    """The PS's phases and every transition of ``ps_rules.TRANSITIONS``, as a Mermaid block.

    Returns
    -------
    str
        A fenced ``mermaid`` code block (``stateDiagram-v2``), one edge per transition,
        labelled with its reason, in the table's order.
    """
    lines = ["```mermaid", "stateDiagram-v2", f"    [*] --> {PSPhase.JOINING.name}"]
    for src, nexts in PS_TRANSITIONS.items():
        for dst, why in nexts.items():
            lines.append(f"    {src.name} --> {dst.name} : {_label(why)}")
    lines += [f"    {PSPhase.FINISHED.name} --> [*]", "```"]
    return "\n".join(lines) + "\n"


def worker_mermaid() -> str:
    """The worker's phases and every transition of ``worker_rules.TRANSITIONS`` (Mermaid).

    The edges into CLOSED (from every phase) and into CONNECTING (from every open phase) are
    drawn once each, from a note, so that the diagram stays readable; the table beside it
    lists them all.

    Returns
    -------
    str
        A fenced ``mermaid`` code block (``stateDiagram-v2``).
    """
    closed, connecting = WorkerPhase.CLOSED, WorkerPhase.CONNECTING
    lines = ["```mermaid", "stateDiagram-v2", f"    [*] --> {closed.name}"]
    into_closed = into_connecting = ""
    order = list(WorkerPhase)  # the table's order of set-built rows varies with the hash seed
    for (src, dst), why in sorted(WORKER_TRANSITIONS.items(),
                                  key=lambda kv: (order.index(kv[0][0]), order.index(kv[0][1]))):
        if dst is closed and src is not closed:
            into_closed = why
        elif dst is connecting and src is not closed:
            into_connecting = why
        else:
            lines.append(f"    {src.name} --> {dst.name} : {_label(why)}")
    lines += [
        f"    note right of {closed.name}",
        f"        every phase --> {closed.name} - {_label(into_closed)}",
        f"        every open phase --> {connecting.name} - {_label(into_connecting)}",
        "    end note",
        "```",
    ]
    return "\n".join(lines) + "\n"


def _transition_table(rows: list[tuple[str, str, str]]) -> str:
    out = ["| from | to | when |", "|---|---|---|"]
    out += [f"| {a} | {b} | {why} |" for a, b, why in rows]
    return "\n".join(out) + "\n"


def ps_kind_table() -> str:
    """What each kind of frame from an authenticated worker does in each PS phase.

    Returns
    -------
    str
        A Markdown table, kinds by phases, each cell the handler's rule name (``ps.RULES``).
    """
    phases = list(PSPhase)
    kinds = sorted({k for row in _ps.RULES.values() for k in row})
    out = ["| kind | " + " | ".join(p.name for p in phases) + " |",
           "|---" * (len(phases) + 1) + "|"]
    for kind in kinds:
        cells = [_ps.RULES.get(p, {}).get(kind, "–") for p in phases]
        out.append(f"| `{kind}` | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def worker_kind_table() -> str:
    """The phases in which the worker accepts each kind of frame from the PS.

    Returns
    -------
    str
        A Markdown table, kinds by phases, ✓ where ``worker.ACCEPTS`` admits the kind.
    """
    phases = list(WorkerPhase)
    out = ["| kind | " + " | ".join(p.name for p in phases) + " |",
           "|---" * (len(phases) + 1) + "|"]
    for kind in sorted(_worker.ACCEPTS):
        allowed = _worker.ACCEPTS[kind]
        out.append(f"| `{kind}` | " + " | ".join("✓" if p in allowed else ""
                                                  for p in phases) + " |")
    return "\n".join(out) + "\n"


def render_page() -> str:
    """``docs/state-machines.md``: both machines' diagrams and tables, generated.

    Returns
    -------
    str
        The whole Markdown page.
    """
    ps_rows = [(a.name, b.name, why) for a, nexts in PS_TRANSITIONS.items()
               for b, why in nexts.items()]
    order = list(WorkerPhase)  # the table's order of set-built rows varies with the hash seed
    w_rows = [(a.name, b.name, why) for (a, b), why in sorted(
        WORKER_TRANSITIONS.items(), key=lambda kv: (order.index(kv[0][0]), order.index(kv[0][1])))]
    return "\n".join([
        "# State machines",
        "",
        "Generated from the cores' rule tables by `python -m aiogc.core.diagram >"
        " docs/state-machines.md`;",
        "`tests/test_state_diagrams.py` fails when this page differs from the tables. The",
        "normative description of each transition is",
        "[the protocol, §5](protocol.md#5-state-machines).",
        "",
        "## Parameter server",
        "",
        "Phases and transitions (`aiogc/core/ps_rules.py`, `TRANSITIONS`):",
        "",
        ps_mermaid(),
        _transition_table(ps_rows),
        "What a frame from an authenticated worker does in each phase (`ps.RULES`, built from",
        "each handler's `@handles` row; a kind not listed, e.g. every PS→W kind, is refused with",
        "`bad_kind`):",
        "",
        ps_kind_table(),
        "## Worker",
        "",
        "Phases and transitions (`aiogc/core/worker_rules.py`, `TRANSITIONS`):",
        "",
        worker_mermaid(),
        _transition_table(w_rows),
        "The phases in which the worker accepts each kind (`worker.ACCEPTS`); any other kind",
        "closes the connection with `bad_kind`:",
        "",
        worker_kind_table(),
    ]).rstrip("\n") + "\n"


if __name__ == "__main__":
    print(render_page(), end="")
