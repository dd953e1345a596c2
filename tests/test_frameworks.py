"""``torch:`` and ``jax:`` tasks (aiogc.training.frameworks): the framework's own gradients per
chunk, the PS stepping with the framework's optimizer, live on loopback.

Skipped, with the reason, when torch or jax is not installed -- unless AIOGC_REQUIRE_TORCH=1 /
AIOGC_REQUIRE_JAX=1 (set by .ci/run, which installs both): then a missing package fails.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aiogc.config import RunConfig
from aiogc.core import PSOptions, Worker
from aiogc.errors import ConfigError
from aiogc.harness.kit import make_ps, materialise_for
from aiogc.harness.local import run_live
from aiogc.harness.options import RunOptions
from aiogc.net.drivers import PSServer, WorkerClient
from aiogc.training.frameworks import (
    chunk_bounds,
    parse_framework_spec,
    shuffle_order,
    task_stepper,
)
from aiogc.training.setup import SetupCache, TaskNotAllowed, TaskPolicy
from aiogc.training.tasks import chunk_gradients, make_task, task_kind
from tests import framework_models as fm

MODELS = Path(fm.__file__).resolve()
SPECS = {"torch": f"torch:{MODELS}:torch_tiny", "jax": f"jax:{MODELS}:jax_tiny"}
#: seconds a loopback test may take before it is a hang (not a timing assertion)
GUARD_S = 120.0
#: float32 unit roundoff
U32 = float(np.finfo(np.float32).eps) / 2


def assert_float32_close(actual: np.ndarray, desired: np.ndarray, n_terms: int) -> None:
    """Two float32 evaluations of the same gradient, in different orders (jit fusion, another
    kernel), agree normwise within Higham's gamma_n = n u / (1 - n u) for sums of at most
    ``n_terms`` terms. Elementwise relative checks are not a float32 guarantee: an entry that is
    a sum with cancellation can differ in many of its own ulps (and does, on some CPUs)."""
    gamma = n_terms * U32 / (1 - n_terms * U32)
    err = float(np.linalg.norm(np.asarray(actual) - np.asarray(desired)))
    assert err <= gamma * float(np.linalg.norm(desired)), (err, gamma)


def _require(name: str) -> None:
    if importlib.util.find_spec(name) is None:
        if os.environ.get(f"AIOGC_REQUIRE_{name.upper()}") == "1":
            pytest.fail(f"AIOGC_REQUIRE_{name.upper()}=1 but {name} is not installed")
        pytest.skip(f"{name} is not installed (pip install 'aiogc[{name}]')")


@pytest.fixture(params=["torch", "jax"])
def framework(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    _require(name)
    return name


def _reference_chunk_grad(framework: str, seed: int, n_chunks: int, chunk: int) -> np.ndarray:
    """The framework's own autodiff gradient of chunk ``chunk``'s share of the loss, computed
    here without the adapter: the factory's model, the documented shuffle and chunking."""
    X, y = fm.data(seed)
    n = X.shape[0]
    rows = shuffle_order(n, seed)[slice(*chunk_bounds(n, n_chunks, "t")[chunk:chunk + 2])]
    share = len(rows) / n
    if framework == "torch":
        import torch

        torch.manual_seed(seed)  # as the adapter does before calling the factory
        model, loss, _ = fm.torch_tiny(seed)
        model.zero_grad()
        (loss(model(torch.from_numpy(X[rows])), torch.from_numpy(y[rows])) * share).backward()
        flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        return np.asarray(flat.numpy(), dtype=np.float64)
    import jax
    from jax.flatten_util import ravel_pytree

    params = fm.jax_init(seed)
    g = jax.grad(lambda p: fm.jax_loss(fm.jax_apply(p, X[rows]), y[rows]) * share)(params)
    return np.asarray(ravel_pytree(g)[0], dtype=np.float64)


def test_chunk_gradient_is_the_frameworks_autodiff_gradient(framework: str) -> None:
    task = make_task(SPECS[framework], 6, 3)
    w0 = task.initial_model()
    assert w0.dtype == np.float64 and w0.shape == (task.dim,)
    for chunk in (0, 5):
        ref = _reference_chunk_grad(framework, 3, 6, chunk)
        # each entry sums over the chunk's samples through both layers' widths
        assert_float32_close(task.chunk_gradient(chunk, w0), ref,
                             fm.N_SAMPLES * (fm.N_FEATURES + fm.HIDDEN))
    # the chunk gradients add up to the full-batch gradient (float32 rounding)
    G = chunk_gradients(task, range(6), w0)
    full = task.full_gradient(w0)
    assert np.linalg.norm(G.sum(axis=0) - full) <= 1e-5 * np.linalg.norm(full)
    # rebuilt from (spec, n_chunks, seed), as a worker process does: the same numbers
    again = make_task(task.spec, 6, 3)
    assert np.array_equal(again.chunk_gradient(2, w0), task.chunk_gradient(2, w0))


def test_torch_sum_loss_is_divided_by_n() -> None:
    _require("torch")
    mean = make_task(SPECS["torch"], 4, 1)
    total = make_task(f"torch:{MODELS}:torch_tiny_sum", 4, 1)
    w = mean.initial_model()
    assert_float32_close(total.chunk_gradient(1, w), mean.chunk_gradient(1, w),
                         fm.N_SAMPLES * (fm.N_FEATURES + fm.HIDDEN))
    # two float32 sums of N_SAMPLES non-negative losses and a division, each within gamma_n
    assert total.loss(w) == pytest.approx(mean.loss(w), rel=2 * (fm.N_SAMPLES + 1) * U32)


def test_torch_stepper_is_torch_optim_and_undoes_uncommitted_steps() -> None:
    _require("torch")
    import torch

    task = make_task(SPECS["torch"] + ",optimizer=adam,lr=0.05", 4, 0)
    stepper = task_stepper(task, 0.05)
    assert stepper is not None
    w = task.initial_model()
    g1, g2 = task.full_gradient(w), task.full_gradient(w) * -0.5
    # reference: torch.optim.Adam on a copy of the parameters fed the same gradients
    ref = [p.detach().clone().requires_grad_(True) for p in task.params]  # type: ignore[attr-defined]
    opt = torch.optim.Adam(ref, lr=0.05)
    for g in (g1, g2):
        at = 0
        for p in ref:
            p.grad = torch.from_numpy(g[at:at + p.numel()]).float().view_as(p)
            at += p.numel()
        opt.step()
    expect = torch.cat([p.detach().reshape(-1) for p in ref]).double().numpy()
    w1 = stepper.step(w, g1)
    stepper.commit()
    stepper.step(w1, g1 * 100)  # rejected by the guard: never committed
    w2 = stepper.step(w1, g2)  # starts again from the committed Adam state
    stepper.commit()
    np.testing.assert_array_equal(w2, expect)


def test_jax_stepper_is_optax_and_undoes_uncommitted_steps() -> None:
    _require("jax")
    import optax

    task = make_task(SPECS["jax"] + ",optimizer=adam,lr=0.05", 4, 0)
    stepper = task_stepper(task, 0.05)
    assert stepper is not None
    w = task.initial_model()
    g1 = task.full_gradient(w)
    tx = optax.adam(0.05)
    p = np.asarray(w, dtype=np.float32)
    state = tx.init(p)
    for g in (g1, -0.5 * g1):
        upd, state = tx.update(np.asarray(g, dtype=np.float32), state, p)
        p = np.asarray(optax.apply_updates(p, upd))
    w1 = stepper.step(w, g1)
    stepper.commit()
    stepper.step(w1, g1 * 100)
    w2 = stepper.step(w1, -0.5 * g1)
    stepper.commit()
    # the same optax arithmetic (maybe fused differently), elementwise on parameters of order
    # 1: a few float32 ulps
    np.testing.assert_allclose(w2, p, rtol=16 * U32, atol=16 * U32)


def test_framework_specs_are_code_a_worker_never_takes_from_the_ps() -> None:
    spec = SPECS["torch"]
    assert task_kind(spec) == ("plugin", None)
    assert task_kind(SPECS["jax"]) == ("plugin", None)
    with pytest.raises(TaskNotAllowed):
        TaskPolicy().check(spec)
    with pytest.raises(TaskNotAllowed):
        TaskPolicy(task=SPECS["jax"]).check(spec)
    TaskPolicy(task=spec).check(spec)  # the worker's own --task


@pytest.mark.parametrize("bad", ["torch:", "torch:mod", "torch:m:f,optimizer=lbfgs",
                                 "torch:m:f,lr=-1", "torch:m:f,lr=x", "jax:m:f,lr=1,lr=2"])
def test_bad_framework_specs_name_the_syntax(bad: str) -> None:
    fw, _, rest = bad.partition(":")
    with pytest.raises(ConfigError, match="task"):
        parse_framework_spec(fw, rest, bad)


def test_options_parse() -> None:
    fs = parse_framework_spec("jax", "a/b.py:make,optimizer=adam,lr=0.003", "s")
    assert (fs.target, fs.attr, fs.optimizer, fs.lr) == ("a/b.py", "make", "adam", 0.003)
    assert parse_framework_spec("torch", "pkg.mod:f", "s").lr == 0.1


def _config(spec: str, **kw: Any) -> RunConfig:
    # A framework's first calls compile (jit, optimizer state) and hold the one event loop that
    # the PS and the in-process workers share; on a loaded machine that takes tens of seconds.
    # These tests are about gradients and training, not liveness: every deadline is the hang
    # guard, so none races a compile.
    base: dict[str, Any] = dict(workers=4, delta=2, n_parts=1, rounds=1, seed=5, task=spec,
                                delay="exp:0.002", heartbeat_s=1.0, dead_after_s=GUARD_S,
                                join_timeout_s=GUARD_S, round_timeout_s=GUARD_S)
    base.update(kw)
    return RunConfig(**base)


async def _one_loopback_round(config: RunConfig) -> Any:
    """Serve a PS on 127.0.0.1 (port 0) with m in-process worker clients whose operator allowed
    ``config.task``; the PS's records, decoded gradients kept."""
    schedule = materialise_for(config, [config.scheme])
    ps, task = make_ps(config, schedule=schedule, keep_gradients=True, options=PSOptions())
    # the workers' task (the framework import and model build take seconds on a loaded
    # machine) is built before any socket opens, once for all of them, so that no connection
    # or login deadline runs while it is built; the clients give up only at the test's guard
    setups = SetupCache(TaskPolicy(task=config.task))
    await asyncio.to_thread(setups.get, config)
    server = PSServer(ps, host="127.0.0.1", port=0, join_clock=False)  # GUARD_S bounds it
    serving = asyncio.create_task(server.serve())
    await server.started.wait()
    clients = [asyncio.create_task(WorkerClient(
        Worker(j), "127.0.0.1", server.port, setups=setups, give_up_after_s=GUARD_S).run())
        for j in range(ps.m)]
    await serving
    await asyncio.gather(*clients)
    assert setups.builds == 1  # every worker took the setup built above
    return ps.records, task


def test_live_exact_round_decodes_the_full_batch_gradient(framework: str) -> None:
    config = _config(SPECS[framework])

    async def main() -> Any:
        async with asyncio.timeout(GUARD_S):
            return await _one_loopback_round(config)

    records, task = asyncio.run(main())
    assert len(records) == 1 and records[0].status == "exact"
    decoded = records[0].gradient
    full = task.full_gradient(task.initial_model())  # one full-batch backward pass
    # float32 model: the chunk sum differs from one full-batch pass by float32 rounding
    err = np.linalg.norm(decoded - full) / np.linalg.norm(full)
    assert err <= 1e-5, err


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_short_live_training_run_lowers_the_loss(framework: str, optimizer: str) -> None:
    spec = f"{SPECS[framework]},optimizer={optimizer}" + (",lr=0.05" if optimizer == "adam" else "")
    config = _config(spec, rounds=25, scheme="partial")
    result = run_live(config, ["partial", "original"],
                      RunOptions(mode="coroutines", verify=True, plots=False))
    task = make_task(spec, config.build_scheme().n_chunks, config.seed)
    initial = task.loss(task.initial_model())
    for name in ("partial", "original"):
        recs = result.records[name]
        assert [r.status for r in recs] == ["exact"] * 25, name
        losses = [r.loss for r in recs]
        assert all(np.isfinite(losses))
        assert losses[-1] < 0.8 * initial, (name, initial, losses)
    # both schemes decode the same exact gradients from the same model: the same trajectory
    np.testing.assert_allclose([r.loss for r in result.records["partial"]],
                               [r.loss for r in result.records["original"]], rtol=1e-4)


# ------------------------------------------------------------------ examples/mlp_digits.py

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "mlp_digits.py"


def _require_example(framework: str) -> None:
    _require(framework)
    if importlib.util.find_spec("sklearn") is None:
        if os.environ.get("AIOGC_REQUIRE_EXAMPLES") == "1":
            pytest.fail("AIOGC_REQUIRE_EXAMPLES=1 but scikit-learn is not installed")
        pytest.skip("scikit-learn is not installed (pip install 'aiogc[examples]')")


def test_the_digits_example_builds_for_both_frameworks(framework: str) -> None:
    _require_example(framework)
    attr = "torch_mlp" if framework == "torch" else "jax_mlp"
    task = make_task(f"{framework}:{EXAMPLE}:{attr}", 24, 0)
    assert task.dim == 64 * 32 + 32 + 32 * 10 + 10  # 64 -> 32 -> 10 MLP
    w0 = task.initial_model()
    full = task.full_gradient(w0)
    G = chunk_gradients(task, range(24), w0)
    assert np.linalg.norm(G.sum(axis=0) - full) <= 1e-5 * np.linalg.norm(full)
    assert task.loss(w0) == pytest.approx(np.log(10), rel=0.1)  # ~uniform over 10 classes


def test_the_example_reads_time_to_target_from_rounds_csv(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("mlp_digits_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    (tmp_path / "rounds.csv").write_text(
        "scheme,round,start_s,end_s,loss\n"
        "partial,0,10.0,10.5,2.0\npartial,1,10.5,11.0,0.4\n"
        "original,0,20.0,21.0,2.0\noriginal,1,21.0,22.0,0.9\n")
    assert mod.time_to_target(str(tmp_path), 0.5) == {"partial": 1.0, "original": None}


def test_the_ps_steps_with_the_frameworks_optimizer_on_the_virtual_clock(framework: str) -> None:
    """PS + m workers on the virtual clock (no sockets): each round's loss is the loss after
    the framework's Adam applied to the full-batch gradient, round after round."""
    from tests.helpers import build_rig

    spec = SPECS[framework] + ",optimizer=adam,lr=0.05"
    rig = build_rig(_config(spec, rounds=8, scheme="partial"))
    rig.sim.run()
    recs = rig.ps.records
    assert [r.status for r in recs] == ["exact"] * 8
    task = make_task(spec, rig.scheme.n_chunks, 5)
    stepper = task_stepper(task, 0.05)
    assert stepper is not None
    w = task.initial_model()
    expect = []
    for _ in range(8):
        w = stepper.step(w, chunk_gradients(task, range(task.n_chunks), w).sum(axis=0))
        stepper.commit()
        expect.append(task.loss(w))
    np.testing.assert_allclose([r.loss for r in recs], expect, rtol=1e-4)
    assert expect[-1] < expect[0]
