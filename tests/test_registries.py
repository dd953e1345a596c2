"""Delay models and orderings are registries, like schemes: the usage text, the help, the docs
and the list in docs/guide/runs.md follow from them (checked here), an unknown name is refused
with the known ones listed, a spec that is easy to misread is warned about, and adding a model
or an ordering is one file (a copy of the package with one file edited, in a fresh interpreter)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import aiogc.training.delays as delays
from aiogc.cli import command_parser, main
from aiogc.coding.ordering_registry import ordering_names, ordering_spec
from aiogc.config import RunConfig
from aiogc.errors import ConfigError
from aiogc.training.delay_models import _DELAYS, delay_names, delay_usage

ROOT = Path(__file__).resolve().parents[1]
RUNS_DOC = (ROOT / "docs" / "guide" / "runs.md").read_text()


def _flat(text: str) -> str:
    return " ".join(text.split())


# ------------------------------------------------------------------ delay models


def test_the_usage_and_the_help_are_the_registry() -> None:
    forms = [s.form for s in _DELAYS.values()]
    assert delay_usage() == " | ".join(forms)
    for cmd in ("run", "simulate"):
        text = _flat(command_parser(cmd).format_help())
        assert delay_usage() in text, cmd
    with pytest.raises(ConfigError) as exc:
        delays.parse_delay("gamma:2,1")
    assert delay_usage() in str(exc.value) and "'gamma'" in str(exc.value)


def test_the_docs_list_every_model() -> None:
    doc = delays.__doc__ or ""
    for s in _DELAYS.values():
        assert f"`{s.form}`" in RUNS_DOC, f"docs/guide/runs.md's delay list lacks {s.form}"
        assert f"``{s.name}" in doc, f"training/delays.py's docstring lacks {s.name}"


def test_a_pareto_without_scale_is_warned_about(capsys: pytest.CaptureFixture[str]) -> None:
    assert delays.delay_cautions("pareto:2.5,0.0012") == []
    assert delays.delay_cautions("exp:0.02") == []
    (c,) = delays.delay_cautions("straggle:0.25,5,pareto:2.5")
    assert "pareto:2.5" in c and "1 second" in c and "pareto:2.5,0.6" in c
    assert delays.parse_delay("pareto:2.5").spec == "pareto:2.5"  # still accepted
    assert main(["simulate", "--delay", "pareto:2.5", "--rounds", "5"]) == 0
    err = capsys.readouterr().err
    assert "pareto:2.5 has no SCALE" in err
    assert main(["simulate", "--delay", "pareto:2.5,0.0012", "--rounds", "5"]) == 0
    assert "SCALE" not in capsys.readouterr().err


# ------------------------------------------------------------------ orderings


def test_an_unknown_ordering_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ConfigError) as exc:
        RunConfig(ordering="reverse")
    for name in ordering_names():
        assert name in str(exc.value)
    text = _flat(command_parser("run").format_help())
    for name in ordering_names():
        assert f"{name}: {_flat(ordering_spec(name).help)}" in text


def test_every_scheme_that_takes_an_order_builds_each_static_one() -> None:
    for name in ordering_names(static=True):
        for scheme in ("partial", "stream-chunks"):
            sc = RunConfig(scheme=scheme, workers=6, delta=3, ordering=name).build_scheme()
            assert len(sc.orders) == 6


# ------------------------------------------------------------------ adding one is one file

TWICE = '''

@dataclass(frozen=True, repr=False)
class Twice(DelayModel):
    """Exactly twice ``seconds`` per chunk (``twice:T``)."""

    seconds: float
    spec: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "spec", f"twice:{self.seconds!r}")

    def sample(self, rng: np.random.Generator, rounds: int, m: int, max_chunks: int) -> np.ndarray:
        return np.full((rounds, m, max_chunks), 2.0 * self.seconds)


register_delay(DelaySyntax("twice", "twice:T", "twice:T with T >= 0", "exactly 2T seconds",
                           (Param("T", _nonneg),), Twice))
'''

REVERSE = '''

register_ordering(OrderingSpec(
    "reverse", lambda A, n_parts, rng, speeds, sizes: [o[::-1] for o in natural_order(A)],
    "natural, backwards"))
'''

CHECK = '''
import contextlib, io, json
import numpy as np
import aiogc
assert aiogc.__file__.startswith(TMP), aiogc.__file__
from aiogc.cli import command_parser, main
from aiogc.coding.orderings import natural_order
from aiogc.config import RunConfig
from aiogc.training.delays import delay_usage, materialise, parse_delay

assert parse_delay("twice:0.01").spec == "twice:0.01"
s = materialise("straggle:0.5,3,twice:0.01", rounds=2, m=4, max_chunks=2, seed=0)
assert sorted(set(s.compute_s.ravel().round(9))) == [0.02, 0.06]
assert delay_usage().endswith("| twice:T")
cfg = RunConfig(workers=5, delta=2, ordering="reverse", delay="twice:0.01")
for sch in ("partial", "stream-chunks"):
    sc = cfg.replace(scheme=sch).build_scheme()
    for j, o in enumerate(sc.orders):
        assert list(o) == list(natural_order(sc.A)[j][::-1]), (sch, j, o)
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    rc = main(["simulate", "--workers", "5", "--delta", "2", "--ordering", "reverse",
               "--delay", "twice:0.01", "--rounds", "3", "--schemes", "partial,stream-chunks"])
assert rc == 0
out = json.loads(buf.getvalue())
assert out["config"]["ordering"] == "reverse" and out["config"]["delay"] == "twice:0.01"
helptext = " ".join(command_parser("run").format_help().split())
assert "reverse: natural, backwards" in helptext
assert "twice:T" in helptext
print("kinds ok")
'''


def test_a_new_delay_model_and_ordering_are_one_file_each(tmp_path: Path) -> None:
    pkg = tmp_path / "aiogc"
    shutil.copytree(ROOT / "aiogc", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    before = {p.relative_to(pkg): p.read_bytes() for p in pkg.rglob("*") if p.is_file()}
    models = pkg / "training" / "delay_models.py"
    models.write_text(models.read_text() + TWICE)
    orderings = pkg / "coding" / "ordering_registry.py"
    orderings.write_text(orderings.read_text() + REVERSE)
    changed = {str(p) for p, raw in before.items()
               if (pkg / p).is_file() and (pkg / p).read_bytes() != raw}
    assert changed == {"training/delay_models.py", "coding/ordering_registry.py"}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
           "PYTHONDONTWRITEBYTECODE": "1"}
    script = f"TMP = {str(tmp_path)!r}\n" + textwrap.dedent(CHECK)
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "kinds ok" in done.stdout


def test_registries_refuse_a_second_entry_of_a_name() -> None:
    from aiogc.coding.ordering_registry import OrderingSpec, register_ordering
    from aiogc.errors import CodingError
    from aiogc.training.delay_models import DelaySyntax, register_delay

    with pytest.raises(CodingError, match="natural"):
        register_ordering(OrderingSpec("natural", ordering_spec("natural").build, "again"))
    with pytest.raises(ConfigError, match="exp"):
        register_delay(DelaySyntax("exp", "exp:X", "exp:X", "again", parse=lambda p, r: None))  # type: ignore[arg-type,return-value]
    assert delay_names()[0] == "none" and json.dumps(list(delay_names()))
