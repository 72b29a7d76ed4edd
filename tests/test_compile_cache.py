"""A sweep compiles each group's train step once, the next group's while the current one trains
(`ahead`); rerun in a fresh process with the persistent compilation cache it compiles nothing:
every program (train steps, init, eval, diagnostics) comes from the cache. Counted from JAX's own
monitoring events (`compile_log.CompileLog`), which the sweep prints in its last lines."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest
from helpers import REPO, TINY_MODEL, experiment_source

from scale_ablation.training import runtime


def experiment(steps_per_call: int) -> str:
    """Two runs that train as one ensemble and one of another shape that trains alone; with 2
    steps per program every chunk has 2 steps (the state is read at steps 2 and 4)."""
    return experiment_source(
        "Two runs that train as one ensemble and one of another shape that trains alone.",
        {**TINY_MODEL, "train.steps": 4, "train.warmup_steps": 0,
         "train.log_every": 2, "train.eval_every": 2, "train.diag_every": 2,
         "checkpoint.every": 4, "wandb.mode": "disabled",
         "train.steps_per_call": steps_per_call},
        repr([{"policy": "none"}, {"policy": "inv_dk"},
              {"policy": "inv_sqrt_dk", "model.head_dim": 8}]))
LINE = re.compile(r"\[sweep\] compiled (\d+) programs \((\d+) train steps, (\d+) of them "
                  r"ahead\), (\d+) loaded")


KINDS = re.compile(r"compiled by kind: (.*)$", re.M)


def kinds(stdout: str) -> dict[str, int]:
    """The sweep's 'compiled by kind: name n, ...' as {name: n} (empty when none compiled)."""
    found = KINDS.search(stdout)
    return {} if not found else {name: int(n) for name, n in
                                 (item.rsplit(" ", 1) for item in found.group(1).split(", "))}


def own_cache_environment() -> dict[str, str]:
    """The suite's environment without its shared cache (conftest.py): this sweep starts cold,
    with the cache beside its workdir."""
    env = {k: v for k, v in os.environ.items() if k != runtime.CACHE_VARIABLE}
    return {**env, "WANDB_MODE": "disabled"}


def run_sweep(spec: str, sweep_dir, by_kind: dict | None = None) -> tuple[int, int, int, int]:
    """(programs compiled, train steps compiled, of them in the compile-ahead thread,
    programs loaded from the cache); `by_kind` is filled with the compiled programs by kind."""
    result = subprocess.run(
        [sys.executable, "-m", "scale_ablation.sweep", f"--config={spec}",
         f"--workdir={sweep_dir}", "--noreport"],
        cwd=REPO, env=own_cache_environment(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    found = LINE.search(result.stdout)
    assert found, result.stdout
    if by_kind is not None:
        by_kind.update(kinds(result.stdout))
    return tuple(int(n) for n in found.groups())


# Two sweeps in subprocesses, ~30 s each: `-m slow`. Chunks of two steps: the same count, on the
# chunked programs.
@pytest.mark.slow
@pytest.mark.parametrize("steps_per_call", [1, 2])
def test_warm_cache_rerun_compiles_nothing(tmp_path, steps_per_call):
    spec = tmp_path / "tiny_compile.py"
    spec.write_text(experiment(steps_per_call))
    sweep_dir = tmp_path / "sweep"
    by_kind = {}
    compiled, train_steps, ahead, _ = run_sweep(str(spec), sweep_dir, by_kind)
    assert compiled > train_steps  # init, eval, diagnostics, ...
    # The sweep's count by kind adds up to its total and its train-step count (a count done
    # another way).
    assert sum(by_kind.values()) == compiled
    assert sum(n for name, n in by_kind.items() if name.startswith("train_step")) == train_steps
    # One program per structure and kind: init, evaluation and diagnostics once for each of the
    # two structures (the K=2 ensemble and the solo run), not once per run (three).
    assert [by_kind.get(kind) for kind in ("init", "eval_step", "diagnostics_step")] == [2, 2, 2]
    # K=2 and solo, each once: the solo program (of one step, or of a chunk of two) was compiled
    # while the ensemble trained, and its group used it instead of compiling it again.
    assert (train_steps, ahead) == (2, 1)
    for entry in sweep_dir.iterdir():  # the runs go, the compilation cache stays
        if entry.name != ".jax_cache":
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    compiled, train_steps, _, loaded = run_sweep(str(spec), sweep_dir)
    assert (compiled, train_steps) == (0, 0)
    assert loaded > 0


@pytest.mark.parametrize("variable", ["", "user"])
def test_the_cache_is_beside_the_workdir_unless_the_user_named_one(tmp_path, monkeypatch,
                                                                   variable):
    import jax

    named = str(tmp_path / "users_cache")
    monkeypatch.setenv(runtime.CACHE_VARIABLE, named if variable else "")
    before = (jax.config.jax_compilation_cache_dir,
              jax.config.jax_persistent_cache_min_compile_time_secs)
    try:
        runtime.enable_compilation_cache(str(tmp_path / "sweep" / "run"))
        expected = named if variable else str(tmp_path / "sweep" / ".jax_cache")
        assert jax.config.jax_compilation_cache_dir == expected
    finally:  # the suite's own cache again, for the tests after this one
        jax.config.update("jax_compilation_cache_dir", before[0])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", before[1])
