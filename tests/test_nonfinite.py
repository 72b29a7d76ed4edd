"""`scale_ablation.training.nonfinite_replay` and its command: the first non-finite value of a
program, and a diverged run's replay.

The walker is checked on functions whose first overflow is known by construction (the line that
makes it is found in this file's text, not by the walker); the replay against the run's own
record of the step that diverged.
"""

from __future__ import annotations

import json
import math
import pathlib
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
from helpers import REPO, read_json, tiny_config

from scale_ablation.records.run_files import RunFiles
from scale_ablation.training import nonfinite_replay, train

THIS_FILE = pathlib.Path(__file__)


def line_of(marker: str) -> int:
    """The line of this file that ends with `# marker`."""
    lines = THIS_FILE.read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.endswith(f"# {marker}"))


def overflowing_exp(x):
    y = x * 2.0
    return jnp.sum(jnp.exp(y))  # exp overflows


def sqrt_at_zero(x):
    return jnp.sum(jnp.sqrt(x))  # sqrt's derivative


def inf_then_nan(x):
    y = jnp.exp(x)  # overflows to inf
    weight = jnp.exp(-y)  # exp(-inf) = 0: the inf is absorbed
    return jnp.sum(weight) + jnp.sum(y - y)  # inf - inf


def test_the_first_inf_and_the_first_nan_are_told_apart():
    origins = nonfinite_replay.nonfinite_origins(inf_then_nan, jnp.asarray([1.0, 100.0]))
    assert origins.inf.primitive == "exp"
    assert f"test_nonfinite.py:{line_of('overflows to inf')} " in origins.inf.where
    assert origins.nan.primitive == "sub"
    assert f"test_nonfinite.py:{line_of('inf - inf')} " in origins.nan.where
    # Without the last term the inf is absorbed: no NaN anywhere.
    absorbed = nonfinite_replay.nonfinite_origins(lambda x: jnp.sum(jnp.exp(-jnp.exp(x))),
                                                  jnp.asarray([1.0, 100.0]))
    assert absorbed.inf is not None and absorbed.nan is None


def masked_overflow(x):
    causal = jnp.tril(jnp.ones((2, 2), bool))
    masked = jnp.where(causal, x, -jnp.inf)  # a deliberate -inf, converted to float16
    weights = jnp.exp(masked - 20.0)  # 0 where masked
    return jnp.sum(weights * (x * 1e4))  # overflows float16


def test_a_deliberate_inf_is_not_taken_for_the_overflow():
    """The causal mask's -inf (a float32 literal converted to float16, then selected) makes an
    inf before anything overflows; the first inf reported is the product past 65504, where
    the old walk named the conversion, with no finite input."""
    x = jnp.full((2, 2), 10.0, jnp.float16)
    origins = nonfinite_replay.nonfinite_origins(masked_overflow, x)
    assert origins.inf.primitive == "mul"
    assert f"test_nonfinite.py:{line_of('overflows float16')} " in origins.inf.where
    assert origins.inf.inputs_max_abs == (10.0, 1e4)  # both finite: an overflow
    finding = nonfinite_replay.Finding("convert_element_type", "x", (math.nan,))
    assert "none finite" in finding.describe()


def test_a_forward_overflow_is_found_at_its_line():
    x = jnp.asarray([1.0, 60.0], jnp.float32)  # exp(120) > float32's 3.4e38
    finding = nonfinite_replay.first_nonfinite(overflowing_exp, x)
    assert finding is not None and finding.primitive == "exp"
    assert f"test_nonfinite.py:{line_of('exp overflows')} (overflowing_exp)" in finding.where
    assert finding.inputs_max_abs == (120.0,)


def test_a_gradient_only_overflow_is_found_at_the_line_it_differentiates():
    x = jnp.asarray([0.0, 4.0], jnp.float32)
    assert math.isfinite(float(sqrt_at_zero(x)))  # the forward pass is finite
    assert nonfinite_replay.first_nonfinite(sqrt_at_zero, x) is None
    finding = nonfinite_replay.first_nonfinite(jax.grad(sqrt_at_zero), x)
    assert finding is not None
    assert f"test_nonfinite.py:{line_of('sqrt' + chr(39) + 's derivative')}" in finding.where


def test_the_walk_goes_inside_jitted_calls():
    inner = jax.jit(overflowing_exp)
    finding = nonfinite_replay.first_nonfinite(lambda x: inner(x) + 1.0, jnp.asarray([60.0]))
    assert finding is not None and finding.primitive == "exp"


def test_a_finite_program_has_no_finding():
    x = jnp.asarray([1.0, 4.0], jnp.float32)
    assert nonfinite_replay.first_nonfinite(jax.grad(sqrt_at_zero), x) is None


def run_nonfinite(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "scale_ablation.nonfinite", *map(str, args)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def diverged(tmp_path_factory):
    """A tiny run that diverges: lr 1e4 without clipping or warmup (step 4, found by trial)."""
    workdir = tmp_path_factory.mktemp("nonfinite") / "run"
    config = tiny_config(**{"train.lr": 1e4, "train.grad_clip": 0.0, "train.warmup_steps": 0,
                            "train.log_every": 1})
    summary = train.train(config, workdir)
    assert summary["status"] == "diverged"
    return workdir


@pytest.mark.slow  # a diverging run, its replay and the command, ~1 min; the search: above
def test_the_replay_meets_the_divergence_the_run_recorded(diverged):
    at = read_json(diverged / "summary.json")["diverged_at_step"]
    replay = nonfinite_replay.load_replay(str(diverged))
    assert replay.step == at
    (_, loss), grads = jax.jit(replay.loss_and_grad)(replay.params)
    logged = RunFiles(diverged).read_metrics()[-1]
    assert logged["step"] == at
    # The run logged a non-finite loss (null) or gradient norm: the replay has the same.
    if logged["train/loss"] is None:
        assert not math.isfinite(float(loss))
    else:
        assert float(loss) == pytest.approx(logged["train/loss"], rel=1e-5)
        assert nonfinite_replay.nonfinite_gradients(grads)

    result = run_nonfinite(diverged)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"step {at}, replayed from the checkpoint of step {at - 1}"
    assert "does not reproduce" not in result.stdout
    found = [line for line in lines if line.startswith(("first inf, ", "first NaN, "))]
    assert found and found == lines[2:]
    # Replayed alone, the loss overflowed where it did: the forward pass, or the gradient.
    forward = nonfinite_replay.first_nonfinite(replay.loss, replay.params)
    assert all(("in the forward pass" in line) == (forward is not None) for line in found)


@pytest.mark.parametrize("damage", ["completed", "no_checkpoint", "not_a_run"])
def test_what_cannot_be_replayed_is_one_line_and_exit_2(diverged, tmp_path, damage):
    workdir = tmp_path / "run"
    shutil.copytree(diverged, workdir)
    if damage == "completed":
        summary = read_json(workdir / "summary.json")
        (workdir / "summary.json").write_text(json.dumps({**summary, "status": "completed"}))
        expected = "the run is completed, not diverged"
    elif damage == "no_checkpoint":
        shutil.rmtree(workdir / "checkpoints")
        expected = "no checkpoint of step"
    else:
        (workdir / "summary.json").unlink()
        expected = "holds no run and no diverged run of a sweep"
    result = run_nonfinite(workdir)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and expected in result.stderr, result.stderr


def test_a_sweep_directory_replays_each_diverged_run(diverged, tmp_path):
    sweep = tmp_path / "sweep"
    shutil.copytree(diverged, sweep / "b_diverged")
    shutil.copytree(diverged, sweep / "a_completed")
    summary = read_json(sweep / "a_completed" / "summary.json")
    (sweep / "a_completed" / "summary.json").write_text(
        json.dumps({**summary, "status": "completed"}))
    result = run_nonfinite(sweep)
    assert result.returncode == 0, result.stderr
    headers = [line for line in result.stdout.splitlines() if line.startswith("== ")]
    assert headers == ["== b_diverged"]
