"""The arrangement table (issue 56): the chooser against a table of known rates, the plan's CPU
hours against runs × steps × FLOPs per step / the table's rate, the benchmark's FLOP count
against the planner's, the sweep reading a table for this machine, and pinned run processes.
No timing is asserted: the tables here are written by hand.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from flax import nnx
from helpers import TINY_RUN, experiment_source

from benchmarks import arrangements as bench
from scale_ablation import sweep
from scale_ablation.model.build import build_model
from scale_ablation.sweeping import arrangements, planner, sweep_runners
from scale_ablation.training.run_config import validate

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FPT = 3e6  # FLOPs per token of the made-up shape
RUNS, STEPS, FLOPS_PER_STEP = 12, 400, 3e9


def row(processes, threads, members, program, flop_rate, side="jax", compile_s=0.0):
    """A table row whose FLOP/s is `flop_rate`."""
    return {"shape": "s", "side": side, "processes": processes, "threads": threads,
            "members": members, "program": program, "flops_per_token": FPT,
            "tokens_per_s": flop_rate / FPT, "compile_s": compile_s}


def overhead(runner, processes, threads, seconds, members=1):
    return {"shape": "s", "runner": runner, "processes": processes, "threads": threads,
            "members": members, "flops_per_token": FPT, "run_overhead_s": seconds}


def table(rows, overheads=()):
    model, cores = arrangements.machine()
    return {"cpu_model": model, "cores": cores, "date": "2026-12-04", "entries": list(rows),
            "overheads": list(overheads), "path": "arrangements_test.json"}


# 1p: solo 40 GFLOP/s, lax.map K=8 44; 2p pinned solo 60 (the best the sweep runs); not
# runnable and faster still: vmap K=8 (90), 2 pinned processes of K=8 by vmap (100) and 2
# processes not pinned of K=8 by lax.map (110: workers are pinned).
KNOWN = [row(1, 0, 1, "solo", 40e9), row(1, 0, 8, "map", 44e9), row(1, 0, 8, "vmap", 90e9),
         row(2, 1, 1, "solo", 60e9), row(2, 1, 8, "vmap", 100e9), row(2, 0, 1, "solo", 50e9),
         row(2, 0, 8, "map", 110e9), row(1, 0, 1, "torch", 500e9, side="torch")]
GROUP = arrangements.Group(FPT, (STEPS * FLOPS_PER_STEP,) * RUNS)


def test_a_table_with_known_rates_picks_the_known_best():
    choice = arrangements.choose([GROUP], table(KNOWN))
    assert choice.arrangement == arrangements.Arrangement(2, 1, 1, "solo")
    assert choice.arrangement.flags() == ["--parallel=2", "--threads_per_process=1"]
    assert choice.seconds == pytest.approx(RUNS * STEPS * FLOPS_PER_STEP / 60e9)
    assert choice.default_seconds == pytest.approx(RUNS * STEPS * FLOPS_PER_STEP / 44e9)
    assert "--parallel=2 --threads_per_process=1" in choice.line()


def test_a_faster_family_with_xla_flags_is_picked_with_them():
    """Pinned processes with YNN's fusions off, measured faster than with them, are picked,
    and the sweep's flags carry the XLA flag; with them on, the family's rate is its own."""
    no_ynn = {**row(2, 1, 1, "solo", 80e9), "xla_flags": arrangements.NO_YNN}
    choice = arrangements.choose([GROUP], table([*KNOWN, no_ynn]))
    assert choice.arrangement == arrangements.Arrangement(2, 1, 1, "solo", arrangements.NO_YNN)
    assert choice.arrangement.flags()[-1] == f"--process_xla_flags={arrangements.NO_YNN}"
    assert choice.seconds == pytest.approx(RUNS * STEPS * FLOPS_PER_STEP / 80e9)
    with_ynn = arrangements.seconds([GROUP], table([*KNOWN, no_ynn]),
                                    arrangements.Arrangement(2, 1, 1, "solo"))
    assert with_ynn == pytest.approx(RUNS * STEPS * FLOPS_PER_STEP / 60e9)
    # One process cannot take XLA flags: its XLA has started before the sweep chooses.
    assert not arrangements.Arrangement(1, 0, 1, "solo", arrangements.NO_YNN).runnable


def test_pinned_workers_of_ensembles_are_picked_with_their_flags():
    """Two pinned processes each training ensembles (`--workers`), measured fastest, are picked
    for two groups, one a worker, with a group's runs as one program (K = 0, as the default;
    K = 8 would split each group of 12 into two programs, two compilations): each group at half
    the rows' combined rate, its runs' in-process overhead and its compilation on one core
    taking twice as long."""
    workers = row(2, 1, 8, "map", 80e9, compile_s=3.0)
    overheads = [overhead("in_process", 1, 0, 0.5, members=8), overhead("process", 2, 1, 1000.0)]
    choice = arrangements.choose([GROUP, GROUP], table([*KNOWN, workers], overheads))
    assert choice.arrangement == arrangements.Arrangement(2, 1, 0, "map")
    assert choice.arrangement.workers and choice.arrangement.runnable
    assert choice.arrangement.flags() == ["--workers=2", "--max_members=0",
                                          "--threads_per_process=1"]
    one_group = RUNS * STEPS * FLOPS_PER_STEP / 80e9 + RUNS * 0.5 + 3.0
    assert choice.seconds == pytest.approx(2 * one_group)  # each worker: one group, at 40e9
    assert arrangements.from_flags(1, True, 0, 1, workers=2) == choice.arrangement
    # One group: one worker would train it alone at half the rate; not picked.
    alone = arrangements.choose([GROUP], table([*KNOWN, workers], overheads))
    assert not alone.arrangement.workers
    assert arrangements.seconds([GROUP], table([*KNOWN, workers], overheads),
                                choice.arrangement) == pytest.approx(2 * one_group)


def test_run_processes_get_the_xla_flags_after_their_own(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    env = sweep_runners.process_env(0, [], arrangements.NO_YNN)
    assert env["XLA_FLAGS"].split() == ["--xla_force_host_platform_device_count=8",
                                        arrangements.NO_YNN]
    assert sweep_runners.process_env(0, [])["XLA_FLAGS"] == os.environ["XLA_FLAGS"]


def test_a_process_per_run_pays_its_start_up():
    # 5 s a run outside its steps in a fresh process (2.5 s of wall with two at once) and
    # none in this process: the in-process ensemble wins.
    slow_start = table(KNOWN, [overhead("process", 2, 1, 1000.0), overhead("process", 2, 0, 1000.0),
                               overhead("in_process", 1, 0, 0.0)])
    choice = arrangements.choose([GROUP], slow_start)
    assert choice.arrangement == arrangements.DEFAULT
    per_run = RUNS * STEPS * FLOPS_PER_STEP / 60e9 / RUNS
    assert arrangements.seconds([GROUP], slow_start, arrangements.Arrangement(2, 1, 1, "solo")) \
        == pytest.approx(RUNS * (per_run + 1000.0 / 2))


def test_the_default_stays_unless_another_is_clearly_faster():
    close = [row(1, 0, 1, "solo", 40e9), row(1, 0, 8, "map", 44e9),
             row(2, 1, 1, "solo", 44e9 / (1 - arrangements.MARGIN) * 0.99)]
    assert arrangements.choose([GROUP], table(close)).arrangement == arrangements.DEFAULT


def test_ensembles_split_by_k_and_compile_once_per_size():
    rows = [row(1, 0, 1, "solo", 40e9, compile_s=3.0), row(1, 0, 4, "map", 50e9, compile_s=5.0)]
    # 12 runs in programs of 4 (4 runs each) at K=4's rate, one compilation.
    four = arrangements.seconds([GROUP], table(rows), arrangements.Arrangement(members=4))
    assert four == pytest.approx(RUNS * STEPS * FLOPS_PER_STEP / 50e9 + 5.0)
    # 12 runs in programs of 5: 5, 5 at K=4's rate (the nearest), then 2 (as near K=1 as
    # K=4 on the log scale: the first listed, K=1); a compilation for each size.
    five = arrangements.seconds([GROUP], table(rows), arrangements.Arrangement(members=5))
    run = STEPS * FLOPS_PER_STEP
    assert five == pytest.approx(10 * run / 50e9 + 2 * run / 40e9 + 5.0 + 3.0)


def test_unrunnable_arrangements_are_never_picked():
    assert not arrangements.Arrangement(1, 0, 8, "vmap").runnable
    assert not arrangements.Arrangement(2, 1, 8, "vmap").runnable
    assert not arrangements.Arrangement(2, 0, 8, "map").runnable  # workers are pinned
    assert not arrangements.Arrangement(1, 1, 8, "map").runnable  # one pinned process
    # In one process only vmap (not runnable) beats the default's lax.map.
    one_process = table([r for r in KNOWN if r["processes"] == 1])
    assert arrangements.choose([GROUP], one_process).arrangement == arrangements.DEFAULT


def test_tables_are_found_by_cpu_model_and_cores_and_loaded_ones_skipped(tmp_path):
    mine = table(KNOWN)
    del mine["path"]
    other = {**mine, "cores": mine["cores"] + 1, "date": "2027-01-01"}
    loaded = {**mine, "loaded": True, "date": "2027-01-02"}
    for name, content in (("mine", mine), ("other", other), ("loaded", loaded)):
        (tmp_path / f"arrangements_{name}.json").write_text(json.dumps(content))
    found = arrangements.read_table(str(tmp_path))
    assert found["path"].endswith("arrangements_mine.json") and not found.get("loaded")
    assert arrangements.read_table(str(tmp_path), ("another CPU", mine["cores"])) is None


@pytest.fixture(scope="module")
def points(tmp_path_factory):
    """RUNS runs of the tiny model that train as one group, without evaluations."""
    root = tmp_path_factory.mktemp("arrangement")
    spec = root / "seeds.py"
    overrides = {**TINY_RUN, "train.eval_every": 0, "train.diag_every": 0,
                 "train.steps": STEPS}
    spec.write_text(experiment_source("Seeds of the tiny run.", overrides,
                                      repr([{"train.seed": s} for s in range(RUNS)])))
    return sweep.expand(str(spec), str(root / "sweep"))


def flops_per_step_by_hand(config) -> float:
    """Training FLOPs of one step counted from the built model: 3 × the forward, the forward
    2 × (matmul weights + the tied output) + causal attention (each query sees T/2 keys)."""
    model_config = validate(config)
    params = nnx.state(build_model(model_config, nnx.Rngs(0)), nnx.Param)
    leaves = jax.tree_util.tree_leaves_with_path(params)
    tables = sum(int(np.prod(x.shape)) for p, x in leaves
                 if getattr(p[0], "key", None) in ("embed", "position_embed"))
    weights = sum(int(np.prod(x.shape)) for _, x in leaves) - tables
    m, t = model_config, config.data.seq_len
    forward = 2 * (weights + m.d_model * m.vocab_size) + 2 * t * m.num_heads * m.head_dim * \
        m.num_layers
    return 3 * forward * config.train.batch_size * t


def at_shape(rows: list[dict], config) -> list[dict]:
    """`rows` moved to `config`'s FLOPs per token, each at the same FLOP/s."""
    per_token = flops_per_step_by_hand(config) / (config.train.batch_size * config.data.seq_len)
    return [dict(r, flops_per_token=per_token,
                 tokens_per_s=arrangements.flop_rate(r) / per_token) for r in rows]


def plan_seconds(points, cpu_table, arrangement) -> planner.Plan:
    return planner.make_plan(points, planner.device("cpu", measure=False),
                             arrangements.planner_table(cpu_table, arrangement), memory=False)


def test_the_plan_is_runs_times_steps_times_flops_over_the_tables_rate(points):
    config = points[0].config
    per_step = flops_per_step_by_hand(config)
    rows = at_shape(KNOWN, config)
    by_rate = {arrangements.DEFAULT: 44e9, arrangements.Arrangement(2, 1, 1, "solo"): 60e9,
               arrangements.Arrangement(members=1, program="solo"): 40e9}
    for arrangement, rate in by_rate.items():
        plan = plan_seconds(points, table(rows), arrangement)
        assert plan.device_hours * 3600 == pytest.approx(RUNS * STEPS * per_step / rate)
        assert "measured" in plan.programs[0].rate_source
    # A start-up of 4 s a run in a fresh process, two processes at once: 2 s of wall a run.
    plan = plan_seconds(points, table(rows, [overhead("process", 2, 1, 4.0)]),
                        arrangements.Arrangement(2, 1, 1, "solo"))
    assert len(plan.programs) == RUNS  # one run a process
    assert plan.device_hours * 3600 == pytest.approx(RUNS * STEPS * per_step / 60e9 + RUNS * 2.0)


@pytest.mark.parametrize("shape", list(bench.SHAPES))
def test_the_benchmarks_flops_per_step_are_the_planners(shape):
    config = bench.shape_config(shape, quick=True)
    per_step, tokens = bench.flops_per_step(config)
    cost = planner.run_cost(shape, config)
    assert per_step == pytest.approx(cost.train_flops / config.train.steps)
    assert tokens == config.train.batch_size * config.data.seq_len
    assert per_step == pytest.approx(flops_per_step_by_hand(config))


def test_the_studies_shapes_are_the_issues():
    described = {name: bench.shapes_of([name], quick=False)[name]["shape"]
                 for name in bench.SHAPES}
    assert described["dk_exponent"] == ("d_model 128, 2 layers, 4 heads × 32, seq 64, batch 16, "
                                        "400 steps")
    assert "seq 128, batch 16, 300 steps" in described["mup_transfer"]
    # The main job (issue 54): dk_exponent's model at q/k width 16, the same shape otherwise.
    assert described["headline"] == described["dk_exponent"]


def test_the_sweep_takes_its_arrangement_from_this_machines_table(tmp_path, points):
    folder = tmp_path / "tables"
    folder.mkdir()
    mine = table(KNOWN)
    del mine["path"]
    (folder / "arrangements_here.json").write_text(json.dumps(mine))
    spec = tmp_path / "seeds.py"
    spec.write_text(experiment_source("Seeds.", {**TINY_RUN, "train.steps": STEPS},
                                      repr([{"train.seed": s} for s in range(RUNS)])))
    env = {**os.environ, arrangements.TABLES_VARIABLE: str(folder), "JAX_PLATFORMS": "cpu",
           "WANDB_MODE": "disabled"}

    def plan(*flags: str) -> str:
        done = subprocess.run([sys.executable, "-m", "scale_ablation.sweep", f"--config={spec}",
                               f"--workdir={tmp_path / 'sweep'}", "--plan", *flags], cwd=REPO,
                              env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        return done.stdout

    picked = plan()
    assert "[sweep] arrangement: 2 processes, 1 thread each" in picked
    assert "--parallel=2 --threads_per_process=1" in picked
    assert f"{RUNS} runs in {RUNS} programs" in picked  # one run a process, as it will run
    given = plan("--max_members=8")  # a flag given: the table is not asked
    assert "[sweep] arrangement" not in given and "8 runs a program (map)" in given
    assert not (tmp_path / "sweep").exists()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to pin two runs")
def test_pinned_children_get_cores_of_their_own():
    started, seen = [], []
    with arrangements.pinned_children(1, 2) as wrap:
        before = wrap(seen.append)
        for name in ("a", "b"):
            before(name)
            started.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"]))
        assert os.environ["OMP_NUM_THREADS"] == "1"
    time.sleep(0.2)
    masks = [os.sched_getaffinity(p.pid) for p in started]
    for process in started:
        process.terminate()
        process.wait()
    assert seen == ["a", "b"]
    assert all(len(m) == 1 for m in masks) and masks[0] != masks[1]
    assert len(os.sched_getaffinity(0)) >= 2  # this process's own mask is back
