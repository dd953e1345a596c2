"""Adding a message kind touches 2 production files (docs/architecture.md, "Where to
change what"): the message in protocol/messages.py (its dataclass, fields, kind code and
direction) and its handler with its rule row (``@handles``) in the receiving machine's module.

The test does it: a copy of the package gets a worker -> PS kind ``probe`` by editing exactly
those two files, and a fresh interpreter shows that the kind has its code, travels on the wire,
has one outcome in every PS phase (the tables are built from the handlers' rows) and reaches
its handler in a running PS. Nothing else is edited: headers.KIND_CODES, ps_rules and the
wire derive everything from the two edits.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from aiogc.core.common import handles
from aiogc.core.ps import RULES, ParameterServer
from aiogc.core.ps_rules import ALL, rules_of
from aiogc.core.worker import Worker
from aiogc.core.worker_rules import RUNNING, dispatch_of

ROOT = Path(__file__).resolve().parents[1]

PROBE_MESSAGE = '''

@_kind("probe", kind_code=42, seq=_int())
@dataclass(frozen=True, slots=True)
class Probe(Message):
    """Worker -> PS: a throwaway kind (tests/test_adding_a_kind.py)."""

    seq: int
'''

PROBE_HANDLER = '''    @handles("probe", ALL)
    def _on_probe(self, worker: int, peer: Hashable, msg: Message, now: float) -> None:
        self.stats["probe"] += 1

'''

CHECK = '''
import aiogc
from aiogc.config import RunConfig
from aiogc.core import PSPhase
from aiogc.core.ps import _ACCEPTS, RULES
from aiogc.protocol.headers import KIND_CODES
from aiogc.protocol.messages import KINDS, WORKER_TO_PS
from aiogc.protocol.wire import decode_frame_bytes, encode_frame_bytes
from tests.helpers import build_rig

assert aiogc.__file__.startswith(TMP), aiogc.__file__
Probe = KINDS["probe"]
assert KIND_CODES["probe"] == 42 and "probe" in WORKER_TO_PS
frame = encode_frame_bytes(Probe(seq=7))
assert frame[6] == 42 and decode_frame_bytes(frame) == Probe(seq=7)  # [5, 42, 7]
assert all(RULES[ph]["probe"] == "probe" for ph in PSPhase)
assert _ACCEPTS["probe"] == frozenset(PSPhase)
cfg = RunConfig(workers=4, delta=2, rounds=2, delay="const:10", seed=1,
                task="linreg:samples=80,dim=4", heartbeat_s=None, dead_after_s=None)
rig = build_rig(cfg)
rig.sim.run(until=0.5)
assert rig.ps.phase is PSPhase.COMPUTING
peer = rig.sim._peer(1)
rig.ps.receive(peer, Probe(seq=1), now=rig.sim.now)
assert rig.ps.stats["probe"] == 1 and peer in rig.ps._peers  # handled, connection kept
print("probe ok")
'''


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, (path, old)
    path.write_text(text.replace(old, new))


def test_a_new_kind_takes_its_message_and_its_handler(tmp_path: Path) -> None:
    pkg = tmp_path / "aiogc"
    shutil.copytree(ROOT / "aiogc", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    before = {p.relative_to(pkg): p.read_bytes() for p in pkg.rglob("*.py")}

    messages = pkg / "protocol" / "messages.py"
    _edit(messages, 'WORKER_TO_PS: Final = frozenset({"hello",',
          'WORKER_TO_PS: Final = frozenset({"probe", "hello",')
    messages.write_text(messages.read_text() + PROBE_MESSAGE)
    _edit(pkg / "core" / "ps.py", '    @handles("pong", ALL)\n',
          PROBE_HANDLER + '    @handles("pong", ALL)\n')

    changed = {str(p) for p, raw in before.items() if (pkg / p).read_bytes() != raw}
    assert changed == {"protocol/messages.py", "core/ps.py"}

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
           "PYTHONDONTWRITEBYTECODE": "1"}
    script = f"TMP = {str(tmp_path)!r}\n" + textwrap.dedent(CHECK)
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "probe ok" in done.stdout


# ------------------------------------------------------------------ the builders' checks


def test_a_kind_without_an_outcome_in_some_phase_is_refused() -> None:
    """A subclass that hides the pong handler (no row) leaves pong without an outcome."""
    with pytest.raises(AssertionError, match="no rule for pong"):
        type("NoPong", (ParameterServer,), {"_on_ignore": lambda *a: None})


def test_two_outcomes_for_one_phase_and_kind_are_refused() -> None:
    with pytest.raises(AssertionError):
        class TwoPongs(ParameterServer):
            @handles("pong", {next(iter(ALL))})
            def _on_pong_twice(self, *a: object) -> None:
                pass


def test_the_tables_are_the_handlers_rows() -> None:
    """Moving a row moves the table: the worker's ping, declared for RUNNING only."""

    class Narrow(Worker):
        @handles("ping", RUNNING)
        def _on_ping(self, msg: object, now: float) -> None:
            pass

    table = {cls.kind: phases for cls, (phases, _fn) in dispatch_of(Narrow).items()}
    assert table["ping"] == RUNNING
    assert table["pong"] != RUNNING  # the other rows are the base class's
    assert rules_of(ParameterServer) == RULES
