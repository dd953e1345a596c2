"""The state diagrams in the docs are drawn from the cores' rule tables (aiogc.core.diagram):
docs/state-machines.md is the generator's output and docs/protocol.md §5 embeds both diagrams,
so a transition added to, or removed from, a table fails here until the docs are regenerated."""

from __future__ import annotations

import re
from pathlib import Path

from aiogc.core import diagram
from aiogc.core.ps_rules import TRANSITIONS as PS_TRANSITIONS
from aiogc.core.worker_rules import TRANSITIONS as WORKER_TRANSITIONS
from aiogc.core.worker_rules import WorkerPhase

DOCS = Path(__file__).resolve().parents[1] / "docs"
REGENERATE = "python -m aiogc.core.diagram > docs/state-machines.md"


def test_the_state_machines_page_is_the_generators_output() -> None:
    page = (DOCS / "state-machines.md").read_text(encoding="utf-8")
    assert page == diagram.render_page(), f"docs/state-machines.md is stale: {REGENERATE}"


def test_the_protocol_embeds_both_generated_diagrams() -> None:
    spec = (DOCS / "protocol.md").read_text(encoding="utf-8")
    assert diagram.ps_mermaid() in spec, "docs/protocol.md §5.1's diagram is stale"
    assert diagram.worker_mermaid() in spec, "docs/protocol.md §5.2's diagram is stale"


def test_every_ps_transition_is_one_edge() -> None:
    edges = re.findall(r"^    (\w+) --> (\w+) : ", diagram.ps_mermaid(), re.M)
    want = [(a.name, b.name) for a, nexts in PS_TRANSITIONS.items() for b in nexts]
    assert edges == want


def test_every_worker_transition_is_drawn_or_in_the_note() -> None:
    text = diagram.worker_mermaid()
    edges = set(re.findall(r"^    (\w+) --> (\w+) : ", text, re.M))
    closed, connecting = WorkerPhase.CLOSED, WorkerPhase.CONNECTING
    for (a, b) in WORKER_TRANSITIONS:
        if b in (closed, connecting) and a is not closed:
            assert f"--> {b.name} - " in text, (a, b)  # the note's "every phase" line
        else:
            assert (a.name, b.name) in edges, (a, b)
    # the note speaks for every phase only if the table has the edge from every phase
    assert all((p, closed) in WORKER_TRANSITIONS for p in WorkerPhase)
    assert all((p, connecting) in WORKER_TRANSITIONS for p in WorkerPhase if p is not closed)


def test_the_kind_tables_name_every_handler() -> None:
    from aiogc.core import ps, worker
    table = diagram.ps_kind_table()
    for phase, row in ps.RULES.items():
        for kind, rule in row.items():
            line = next(ln for ln in table.splitlines() if ln.startswith(f"| `{kind}` |"))
            cells = [c.strip() for c in line.strip("|").split("|")][1:]
            assert cells[list(type(phase)).index(phase)] == rule, (phase, kind)
    wtable = diagram.worker_kind_table()
    for kind, phases in worker.ACCEPTS.items():
        line = next(ln for ln in wtable.splitlines() if ln.startswith(f"| `{kind}` |"))
        cells = [c.strip() for c in line.strip("|").split("|")][1:]
        assert {p for p, c in zip(WorkerPhase, cells, strict=True) if c == "✓"} == set(phases)
