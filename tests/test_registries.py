"""Delay models, orderings and tasks are registries, like schemes: the usage text, the help, the
docs and the lists in docs/guide/runs.md follow from them (checked here), an unknown name is
refused with the known ones listed, a spec that is easy to misread is warned about, and adding a
model, an ordering or a task is one file (a copy of the package with one file edited, in a fresh
interpreter)."""

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
from aiogc.training.setup import TaskNotAllowed, TaskPolicy
from aiogc.training.tasks import _TASKS, PLUGIN_FORM, make_task, task_kind, task_names, task_usage

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


# ------------------------------------------------------------------ tasks


def test_the_task_usage_help_and_docs_are_the_registry() -> None:
    import aiogc.training.tasks as tasks

    assert task_usage() == " | ".join([*(s.form for s in _TASKS.values()), PLUGIN_FORM])
    assert task_names()[:2] == ("linreg", "logreg")
    for cmd in ("run", "ps", "worker"):  # argparse may wrap a line at a hyphen
        help_text = "".join(command_parser(cmd).format_help().split())
        assert "".join(task_usage().split()) in help_text, cmd
    doc = tasks.__doc__ or ""
    for s in _TASKS.values():
        assert f"`{s.form}`" in RUNS_DOC, f"docs/guide/runs.md's task list lacks {s.form}"
        assert f"``{s.name}" in doc, f"training/tasks.py's docstring lacks {s.name}"


@pytest.mark.parametrize("spec", ["mnist", "mnist:factory", "  "])
def test_an_unknown_task_is_refused_with_the_known_ones(spec: str) -> None:
    with pytest.raises(ConfigError) as exc:
        make_task(spec, 2, 0)
    assert exc.value.field == "task"
    for name in task_names():
        assert name in str(exc.value), (spec, name)
    assert PLUGIN_FORM in str(exc.value)


def test_a_registered_name_without_its_body_names_its_form() -> None:
    for name in ("logreg", "torch", "jax"):
        with pytest.raises(ConfigError) as exc:
            make_task(name, 2, 0)
        assert exc.value.allowed == _TASKS[name].form


def test_what_a_worker_builds_follows_the_registry(tmp_path: Path) -> None:
    policy = TaskPolicy()  # a worker without a task of its own, the PS names one
    for spec in ("linreg", "linreg:samples=50,dim=3", "logreg:builtin", "logreg:breast-cancer"):
        policy.check(spec)
    assert task_kind("logreg:/data/x.csv") == ("logreg-file", "/data/x.csv")
    for spec in ("torch:m:f", "jax:m:f", "mypkg.task:factory", "linreg_typo:factory",
                 "logreg", f"logreg:{tmp_path / 'x.csv'}"):
        with pytest.raises(TaskNotAllowed):
            policy.check(spec)
    TaskPolicy(data_dirs=(str(tmp_path),)).check(f"logreg:{tmp_path / 'x.csv'}")


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


QUADRATIC = '''

def _make_quadratic(rest: str, spec: str, n_chunks: int, seed: int) -> Task:
    opts = _options([t for t in rest.split(",") if t.strip()], spec, {"dim"})
    dim = int(_number(opts, "dim", spec, int, "an integer")) if "dim" in opts else 4
    centres = np.random.default_rng(seed).standard_normal((n_chunks, dim))
    return FunctionTask(lambda i, w: (w - centres[i]) / n_chunks, dim, n_chunks,
                        loss_fn=lambda w: float(((w - centres) ** 2).sum()) / (2 * n_chunks),
                        learning_rate=0.5, name="quadratic", spec=f"quadratic:dim={dim}")


register_task(TaskSyntax("quadratic", "quadratic[:dim=D]",
                         "half the mean squared distance to random centres", _make_quadratic))
'''

CHECK_TASK = '''
import contextlib, csv, io, json, pathlib
import numpy as np
import aiogc
assert aiogc.__file__.startswith(TMP), aiogc.__file__
from aiogc.cli import command_parser, main
from aiogc.errors import ConfigError
from aiogc.training.setup import TaskPolicy
from aiogc.training.tasks import make_task, task_kind, task_usage

t = make_task("quadratic:dim=3", 4, 7)
w = np.ones(3)
assert np.allclose(sum(t.chunk_gradient(i, w) for i in range(4)), t.full_gradient(w))
assert make_task(t.spec, 4, 7).loss(w) == t.loss(w)
assert task_kind("quadratic:dim=3") == ("quadratic", None)
TaskPolicy().check("quadratic:dim=3")  # a worker builds it when the PS names it
assert task_usage().endswith("| quadratic[:dim=D] | MODULE:ATTR")
assert "quadratic[:dim=D]|MODULE:ATTR" in "".join(command_parser("worker").format_help().split())
try:
    make_task("quadratc", 4, 7)
except ConfigError as exc:
    assert "quadratic" in str(exc), exc
else:
    raise AssertionError("an unknown task was built")
out = pathlib.Path(TMP) / "run"
with contextlib.redirect_stdout(io.StringIO()):
    rc = main(["run", "--task", "quadratic:dim=3", "--workers", "4", "--delta", "2",
               "--rounds", "6", "--schemes", "partial", "--as", "coroutines", "--no-plots",
               "--no-progress", "--out", str(out)])
assert rc == 0, rc
summary = json.loads((out / "summary.json").read_text())
assert summary["end_reason"] == "all rounds done", summary["end_reason"]
manifest = json.loads((out / "manifest.json").read_text())
assert manifest["config"]["task"] == "quadratic:dim=3", manifest["config"]["task"]
with (out / "rounds.csv").open() as fh:
    loss = [float(r["loss"]) for r in csv.DictReader(fh)]
assert len(loss) == 6 and all(b < a for a, b in zip(loss, loss[1:])), loss
print("task ok")
'''


def test_a_new_task_is_one_file(tmp_path: Path) -> None:
    pkg = tmp_path / "aiogc"
    shutil.copytree(ROOT / "aiogc", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    before = {p.relative_to(pkg): p.read_bytes() for p in pkg.rglob("*") if p.is_file()}
    tasks = pkg / "training" / "tasks.py"
    tasks.write_text(tasks.read_text() + QUADRATIC)
    changed = {str(p) for p, raw in before.items()
               if (pkg / p).is_file() and (pkg / p).read_bytes() != raw}
    assert changed == {"training/tasks.py"}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
           "PYTHONDONTWRITEBYTECODE": "1"}
    script = f"TMP = {str(tmp_path)!r}\n" + textwrap.dedent(CHECK_TASK)
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "task ok" in done.stdout


def test_registries_refuse_a_second_entry_of_a_name() -> None:
    from aiogc.coding.ordering_registry import OrderingSpec, register_ordering
    from aiogc.errors import CodingError
    from aiogc.training.delay_models import DelaySyntax, register_delay

    with pytest.raises(CodingError, match="natural"):
        register_ordering(OrderingSpec("natural", ordering_spec("natural").build, "again"))
    with pytest.raises(ConfigError, match="exp"):
        register_delay(DelaySyntax("exp", "exp:X", "exp:X", "again", parse=lambda p, r: None))  # type: ignore[arg-type,return-value]
    assert delay_names()[0] == "none" and json.dumps(list(delay_names()))
    from aiogc.training.tasks import TaskSyntax, register_task

    with pytest.raises(ConfigError, match="linreg"):
        register_task(TaskSyntax("linreg", "linreg", "again", _TASKS["linreg"].build))
