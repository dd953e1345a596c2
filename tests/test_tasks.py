"""Tests of aiogc.training.tasks: gradients, chunk sums, GD convergence, file formats, plug-ins,
errors."""

from __future__ import annotations

import importlib.resources
from pathlib import Path

import numpy as np
import pytest

from aiogc.errors import ConfigError
from aiogc.training.datasets import load_libsvm
from aiogc.training.tasks import (
    FunctionTask,
    LinearRegression,
    LogisticRegression,
    Task,
    chunk_gradients,
    make_task,
)


def builtin_fixture_text() -> str:
    """The formula of aiogc/data/README.md that generates aiogc/data/builtin.libsvm."""
    state = 20240601

    def draw() -> float:
        nonlocal state
        state = (1103515245 * state + 12345) % 2**31
        return state / 2**31

    coef = (2.0, -1.5, 1.0, 0.0, 0.5, -0.5, 1.25, -2.0)
    lines = []
    for i in range(200):
        xs = []
        for k in range(8):
            x = float(format(2 * draw() - 1, ".4f"))
            xs.append(0.0 if (i + k) % 4 == 3 else x)
        noise = 2 * draw() - 1
        score = 0.0
        for c, x in zip(coef, xs, strict=True):
            score += c * x
        score = score + 0.3 + noise
        label = "+1" if score > 0 else "-1"
        feats = "".join(f" {k + 1}:{x:.4f}" for k, x in enumerate(xs) if x != 0)
        lines.append(label + feats)
    return "\n".join(lines) + "\n"


SMALL_LINREG = "linreg:samples=300,dim=8,noise=0.1"


def finite_diff(task: Task, w: np.ndarray, h: float = 1e-6) -> np.ndarray:
    g = np.empty_like(w)
    for k in range(w.size):
        e = np.zeros_like(w)
        e[k] = h
        g[k] = (task.loss(w + e) - task.loss(w - e)) / (2 * h)
    return g


def tasks_under_test() -> list[Task]:
    return [
        make_task(SMALL_LINREG, 7, 3),
        make_task("logreg:builtin", 6, 1),
        make_task("logreg:builtin,reg=0.05,bias=0", 5, 2),
    ]


# --------------------------------------------------------------------------- gradients


@pytest.mark.parametrize("idx", range(3))
def test_gradient_matches_finite_differences(idx: int) -> None:
    task = tasks_under_test()[idx]
    rng = np.random.default_rng(idx)
    for _ in range(3):
        w = rng.standard_normal(task.dim)
        g = task.full_gradient(w)
        np.testing.assert_allclose(g, finite_diff(task, w), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("idx", range(3))
def test_chunk_gradients_sum_to_full(idx: int) -> None:
    task = tasks_under_test()[idx]
    rng = np.random.default_rng(10 + idx)
    for _ in range(5):
        w = rng.standard_normal(task.dim) * 3
        G = chunk_gradients(task, range(task.n_chunks), w)
        assert G.shape == (task.n_chunks, task.dim) and G.dtype == np.float64
        full = task.full_gradient(w)
        scale = max(1.0, float(np.abs(full).max()))
        np.testing.assert_allclose(G.sum(axis=0), full, rtol=0, atol=1e-12 * scale)
        # the chunks partition the samples: no chunk gradient is shared
        assert isinstance(task, LinearRegression | LogisticRegression)
        sizes = np.diff(task.bounds)
        assert sizes.sum() == task.n_samples and sizes.max() - sizes.min() <= 1


def test_linreg_gd_monotone_and_converges() -> None:
    task = make_task(SMALL_LINREG, 4, 0)
    assert isinstance(task, LinearRegression)
    w = task.initial_model()
    assert w.shape == (8,) and np.all(w == 0)
    losses = [task.loss(w)]
    for _ in range(300):
        w = w - task.learning_rate * task.full_gradient(w)
        losses.append(task.loss(w))
    assert np.all(np.diff(losses) <= 1e-15)
    assert losses[-1] == pytest.approx(task.optimal_loss, rel=1e-9)
    np.testing.assert_allclose(w, task.w_star, atol=1e-6)
    np.testing.assert_allclose(task.full_gradient(task.w_star), 0, atol=1e-12)
    # the optimum is close to the generating weights; optimal loss ~ noise^2 / 2
    assert task.w_true is not None
    np.testing.assert_allclose(task.w_star, task.w_true, atol=0.05)
    assert task.optimal_loss == pytest.approx(0.005, rel=0.3)


def test_linreg_chunked_gd_is_full_gd() -> None:
    """The PS's update from summed chunk gradients equals the full-gradient step."""
    task = make_task(SMALL_LINREG, 5, 0)
    w1 = task.initial_model()
    w2 = task.initial_model()
    for _ in range(20):
        w1 = w1 - task.learning_rate * task.full_gradient(w1)
        w2 = w2 - task.learning_rate * chunk_gradients(task, range(5), w2).sum(axis=0)
    np.testing.assert_allclose(w1, w2, rtol=1e-12, atol=1e-14)


def test_logreg_builtin_gd_monotone() -> None:
    task = make_task("logreg:builtin", 4, 0)
    assert isinstance(task, LogisticRegression)
    assert (task.n_samples, task.dim) == (200, 9)
    assert set(np.unique(task.y)) == {0.0, 1.0}
    w = task.initial_model()
    losses = [task.loss(w)]
    assert losses[0] == pytest.approx(np.log(2))
    for _ in range(200):
        w = w - task.learning_rate * task.full_gradient(w)
        losses.append(task.loss(w))
    assert np.all(np.diff(losses) <= 1e-15)
    assert losses[-1] < 0.3
    assert task.accuracy(w) > 0.85


def test_determinism_and_seed_dependence() -> None:
    a = make_task(SMALL_LINREG, 4, 5)
    b = make_task(SMALL_LINREG, 4, 5)
    c = make_task(SMALL_LINREG, 4, 6)
    w = np.linspace(-1, 1, 8)
    for i in range(4):
        assert np.array_equal(a.chunk_gradient(i, w), b.chunk_gradient(i, w))
    assert not np.array_equal(a.chunk_gradient(0, w), c.chunk_gradient(0, w))
    # logreg: the seed only changes the shuffle, not the data
    la, lb = make_task("logreg:builtin", 4, 0), make_task("logreg:builtin", 4, 1)
    v = np.full(9, 0.1)
    assert la.loss(v) == pytest.approx(lb.loss(v), rel=1e-14)
    assert not np.array_equal(la.chunk_gradient(0, v), lb.chunk_gradient(0, v))


def test_spec_round_trip(tmp_path: Path) -> None:
    csv_path = tmp_path / "d.csv"
    X, y = _data()
    _write_csv(csv_path, X, y)
    for spec in ["linreg", SMALL_LINREG, "logreg:builtin,reg=0.01", f"logreg:{csv_path},bias=0"]:
        t = make_task(spec, 3, 9)
        t2 = make_task(t.spec, 3, 9)
        assert t2.spec == t.spec and t2.dim == t.dim
        assert t.learning_rate == t2.learning_rate
        w = np.random.default_rng(0).standard_normal(t.dim)
        for i in range(3):
            assert np.array_equal(t.chunk_gradient(i, w), t2.chunk_gradient(i, w))
    assert make_task("linreg", 2, 0).spec == "linreg:samples=2000,dim=50,noise=0.1"


# --------------------------------------------------------------------------- file formats


def _data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(4)
    X = np.round(rng.standard_normal((40, 3)), 6)
    X[X[:, 1] > 0.8, 1] = 0.0  # some zeros, exercised as omitted LIBSVM entries
    y = (X @ np.array([1.0, -2.0, 0.5]) + 0.3 * rng.standard_normal(40) > 0).astype(float)
    return X, y


def _write_csv(path: Path, X: np.ndarray, y: np.ndarray, header: bool = False) -> None:
    lines = ["# a comment", "a,b,c,label"] if header else []
    lines += [",".join(repr(float(v)) for v in [*row, lab]) for row, lab in zip(X, y, strict=True)]
    path.write_text("\n".join(lines) + "\n")


def test_file_formats_agree(tmp_path: Path) -> None:
    X, y = _data()
    pm = 2 * y - 1  # {-1, +1} labels in the LIBSVM file
    _write_csv(tmp_path / "a.csv", X, y)
    _write_csv(tmp_path / "b.csv", X, pm, header=True)
    # label first, selected by index / by name
    first = np.column_stack([y, X])
    (tmp_path / "c.csv").write_text(
        "\n".join(",".join(repr(float(v)) for v in r) for r in first) + "\n"
    )
    np.savez(tmp_path / "d.npz", X=X, y=y)
    lines = []
    for row, lab in zip(X, pm, strict=True):
        feats = " ".join(f"{k + 1}:{float(v)!r}" for k, v in enumerate(row) if v != 0)
        lines.append(f"{int(lab):+d} {feats}  # trailing comment")
    (tmp_path / "e.libsvm").write_text("# header comment\n" + "\n".join(lines) + "\n")
    (tmp_path / "f.txt").write_text("\n".join(lines) + "\n")
    specs = [
        f"logreg:{tmp_path / 'a.csv'}",
        f"logreg:{tmp_path / 'b.csv'},label=label",
        f"logreg:{tmp_path / 'b.csv'},label=-1",
        f"logreg:{tmp_path / 'c.csv'},label=0",
        f"logreg:{tmp_path / 'd.npz'}",
        f"logreg:{tmp_path / 'e.libsvm'}",
        f"logreg:{tmp_path / 'f.txt'},format=libsvm",
    ]
    ref = make_task(specs[0], 4, 0)
    assert isinstance(ref, LogisticRegression)
    assert ref.dim == 4  # 3 features + bias
    for spec in specs[1:]:
        t = make_task(spec, 4, 0)
        assert isinstance(t, LogisticRegression), spec
        assert np.array_equal(t.X, ref.X), spec
        assert np.array_equal(t.y, ref.y), spec


def test_libsvm_parser_details() -> None:
    X, y = load_libsvm(["1 qid:3 2:0.5 5:1", "", "  # only a comment", "-1 1:2"], "mem")
    assert X.shape == (2, 5)
    assert np.array_equal(X, np.array([[0, 0.5, 0, 0, 1], [2, 0, 0, 0, 0]]))
    assert np.array_equal(y, [1, -1])


def test_builtin_fixture_matches_formula() -> None:
    shipped = importlib.resources.files("aiogc").joinpath("data", "builtin.libsvm").read_text()
    assert shipped == builtin_fixture_text()
    assert len(shipped.encode()) < 50_000


def test_label_mapping_general_two_values(tmp_path: Path) -> None:
    X, y = _data()
    _write_csv(tmp_path / "a.csv", X, 2 + 2 * y)  # labels {2, 4} -> {0, 1}
    _write_csv(tmp_path / "b.csv", X, y)
    t1 = make_task(f"logreg:{tmp_path / 'a.csv'}", 2, 0)
    t2 = make_task(f"logreg:{tmp_path / 'b.csv'}", 2, 0)
    assert isinstance(t1, LogisticRegression) and isinstance(t2, LogisticRegression)
    assert np.array_equal(t1.y, t2.y)


@pytest.mark.parametrize(
    ("name", "content", "extra", "match"),
    [
        ("bad.csv", "1,2,0\n1,x,1\n", "", r"bad.csv:2"),
        ("bad.csv", "1,x,0\n1,2,1\n", "", r"bad.csv:1"),
        ("bad.csv", "1,2,0\n1,2\n", "", "3 fields per row"),
        ("bad.csv", "1,2,0\n1,2,5\n3,3,7\n", "", "binary labels"),
        ("bad.csv", "1,2,nan\n", "", "finite"),
        ("bad.csv", "5\n6\n", "", "at least 2 columns"),
        ("bad.csv", "a,b\n", "", "at least one data row"),
        ("bad.csv", "1,2,0\n", ",label=7", "label"),
        ("bad.csv", "1,2,0\n", ",label=nope", "label"),
        ("bad.libsvm", "+1 1:0.5\nfoo 1:2\n", "", r"bad.libsvm:2.*numeric label"),
        ("bad.libsvm", "+1 0:0.5\n", "", "index"),
        ("bad.libsvm", "+1 a:0.5\n", "", "idx:val"),
        ("bad.libsvm", "+1 1:abc\n", "", "numeric value"),
        ("bad.libsvm", "+1 1\n", "", "idx:val"),
        ("bad.libsvm", "+1 99999999:1\n", "", "index"),
        ("bad.libsvm", "# nothing\n", "", "at least one"),
        ("bad.npz", "not a zip", "", "readable .npz"),
        ("bad.csv", "\xff\xfe", "", "UTF-8"),
    ],
)
def test_malformed_files(tmp_path: Path, name: str, content: str, extra: str, match: str) -> None:
    p = tmp_path / name
    if content == "\xff\xfe":
        p.write_bytes(b"\xff\xfe\x00\x81")
    else:
        p.write_text(content)
    with pytest.raises(ConfigError, match=match) as ei:
        make_task(f"logreg:{p}{extra}", 1, 0)
    assert ei.value.field in ("task", "label")


def test_npz_missing_arrays(tmp_path: Path) -> None:
    np.savez(tmp_path / "a.npz", features=np.zeros((3, 2)), y=np.zeros(3))
    with pytest.raises(ConfigError, match="'X' and 'y'"):
        make_task(f"logreg:{tmp_path / 'a.npz'}", 1, 0)
    np.savez(tmp_path / "b.npz", X=np.zeros((3, 2)), y=np.zeros(4))
    with pytest.raises(ConfigError, match="shape"):
        make_task(f"logreg:{tmp_path / 'b.npz'}", 1, 0)
    np.savez(tmp_path / "c.npz", X=np.array([["a"]], dtype=object), y=np.zeros(1))
    with pytest.raises(ConfigError, match="readable"):
        make_task(f"logreg:{tmp_path / 'c.npz'}", 1, 0)


@pytest.mark.parametrize(
    "spec",
    [
        "",
        "nope",
        "linreg:samples=0",
        "linreg:dim=-1",
        "linreg:noise=-1",
        "linreg:foo=1",
        "linreg:samples=abc",
        "linreg:samples=10,samples=20",
        "logreg:",
        "logreg:/does/not/exist.csv",
        "logreg:builtin,reg=-1",
        "logreg:builtin,bias=2",
        "logreg:builtin,format=xml",
        "logreg:builtin,label=1",
        "no_such_module_xyz:factory",
        "aiogc.training.tasks:no_such_attr",
        "aiogc.training.tasks:BUILTIN_DATASET",
        "math:sqrt",
    ],
)
def test_bad_specs(spec: str) -> None:
    with pytest.raises(ConfigError) as ei:
        make_task(spec, 2, 0)
    assert ei.value.field == "task"
    assert "expected" in str(ei.value)


def test_bad_sizes() -> None:
    with pytest.raises(ConfigError, match="n_chunks"):
        make_task("linreg:samples=5,dim=2", 6, 0)
    with pytest.raises(ConfigError, match="n_chunks"):
        make_task("linreg", 0, 0)
    with pytest.raises(ConfigError, match="seed"):
        make_task("linreg", 2, -1)
    t = make_task(SMALL_LINREG, 2, 0)
    with pytest.raises(IndexError):
        t.chunk_gradient(2, t.initial_model())
    with pytest.raises(ValueError, match="shape"):
        t.loss(np.zeros(3))


# --------------------------------------------------------------------------- plug-ins

PLUGIN = """
import numpy as np
from aiogc.training.tasks import FunctionTask

def factory(n_chunks, seed):
    rng = np.random.default_rng(seed)
    targets = rng.standard_normal((n_chunks, 3))
    return FunctionTask(
        lambda i, w: w - targets[i], dim=3, n_chunks=n_chunks,
        loss_fn=lambda w: 0.5 * float(((w - targets) ** 2).sum()), learning_rate=0.05,
    )

class Holder:
    make = staticmethod(factory)

def wrong_chunks(n_chunks, seed):
    return factory(n_chunks + 1, seed)

def not_a_task(n_chunks, seed):
    return 42
"""


def test_plugin_module_and_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_aiogc_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    t = make_task("my_aiogc_plugin:factory", 4, 7)
    assert isinstance(t, FunctionTask) and isinstance(t, Task)
    assert t.spec == "my_aiogc_plugin:factory"
    w = np.ones(3)
    np.testing.assert_allclose(t.full_gradient(w), finite_diff(t, w), atol=1e-6)
    t2 = make_task(t.spec, 4, 7)
    assert np.array_equal(t.chunk_gradient(2, w), t2.chunk_gradient(2, w))
    t3 = make_task("my_aiogc_plugin:Holder.make", 4, 7)
    assert np.array_equal(t.chunk_gradient(1, w), t3.chunk_gradient(1, w))
    f = make_task(f"{tmp_path / 'my_aiogc_plugin.py'}:factory", 4, 7)
    assert np.array_equal(t.chunk_gradient(3, w), f.chunk_gradient(3, w))
    with pytest.raises(ConfigError, match="n_chunks=4"):
        make_task("my_aiogc_plugin:wrong_chunks", 4, 0)
    with pytest.raises(ConfigError, match="returning a Task"):
        make_task("my_aiogc_plugin:not_a_task", 4, 0)
    with pytest.raises(ConfigError, match="importable"):
        make_task(f"{tmp_path / 'missing.py'}:factory", 4, 0)


def test_function_task() -> None:
    t = FunctionTask(lambda i, w: w * (i + 1), dim=2, n_chunks=3, initial=np.array([1.0, 2.0]))
    assert np.array_equal(t.initial_model(), [1.0, 2.0])
    assert np.array_equal(t.full_gradient(np.array([1.0, 1.0])), [6.0, 6.0])
    assert np.isnan(t.loss(np.zeros(2)))
    bad = FunctionTask(lambda i, w: np.zeros(5), dim=2, n_chunks=1)
    with pytest.raises(ValueError, match="shape"):
        bad.chunk_gradient(0, np.zeros(2))
    with pytest.raises(ConfigError, match="learning_rate"):
        FunctionTask(lambda i, w: w, dim=2, n_chunks=1, learning_rate=0)
    with pytest.raises(ConfigError, match="initial"):
        FunctionTask(lambda i, w: w, dim=2, n_chunks=1, initial=np.zeros(3))
