"""Each config read once (issue 26): one command validates each run's config once, builds its
`ModelConfig` once and reads its config.json at most once.

Counted from outside, in a process of the command's own: a driver wraps
`run_config.validate` and `run_config.model_config` with counters before any other module is
imported (so that `from run_config import validate` picks up the wrapper too), and counts every
`open` of a file named config.json for reading, then runs `scale_ablation.main` or
`scale_ablation.sweep` as the command line would.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest
from helpers import QUICK, REPO, TINY_RUN, experiment_source

from scale_ablation.training import experiment_files as experiment

DRIVER = r'''
import atexit, builtins, collections, io, json, os, sys
from scale_ablation.training import run_config

counts = collections.Counter()
real_validate, real_model_config, real_open = (run_config.validate, run_config.model_config,
                                               io.open)


def validate(config):
    counts["validate"] += 1
    return real_validate(config)


def model_config(config):
    counts["model_config"] += 1
    return real_model_config(config)


def counting_open(file, mode="r", *args, **kwargs):
    if (isinstance(file, (str, os.PathLike)) and os.path.basename(os.fspath(file)) == "config.json"
            and not set(mode) & set("wax+")):
        counts["config.json"] += 1
    return real_open(file, mode, *args, **kwargs)


run_config.validate, run_config.model_config = validate, model_config
builtins.open = io.open = counting_open  # pathlib's read_text opens through io.open
atexit.register(lambda: print("COUNTS " + json.dumps(counts)))

import importlib
from absl import app

command = importlib.import_module(sys.argv[1])
sys.argv = [sys.argv[1], *sys.argv[2:]]
parser = getattr(command, "parse_flags", None)
app.run(lambda argv: sys.exit(command.main(argv)), **({"flags_parser": parser} if parser else {}))
'''
ENV = {**os.environ, "WANDB_MODE": "disabled", "JAX_PLATFORMS": "cpu"}
GRID = [{"train.seed": 0}, {"train.seed": 1}]  # one ensemble of two
EXPERIMENT = experiment_source(
    "A two-point sweep for tests/test_config_reads.py.",
    {**TINY_RUN, "train.steps": 6, "train.warmup_steps": 2, "checkpoint.every": 3,
     "train.eval_every": 3},
    repr(GRID),
    when_arg="""
        if arg == "longer":  # the same grid, extended
            config.train.steps = 9
    """)


def counted(module: str, *args: str) -> tuple[dict, str]:
    """The counts of one command (`module` with `args`), and its stdout."""
    done = subprocess.run([sys.executable, "-c", DRIVER, module, *args], cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = re.findall(r"^COUNTS (.*)$", done.stdout, re.M)
    return json.loads(line), done.stdout


def main_args(workdir: pathlib.Path, **overrides) -> list[str]:
    return [f"--config={QUICK}", f"--workdir={workdir}",
            *experiment.override_flags({**TINY_RUN, **overrides})]


def once_per_run(counts: dict, runs: int, reads: int) -> None:
    assert counts.get("validate", 0) == runs, counts
    assert counts.get("model_config", 0) == runs, counts  # the ones inside validate
    assert counts.get("config.json", 0) == reads, counts


@pytest.fixture(scope="module")
def main_counts(tmp_path_factory) -> dict[str, dict]:
    workdir = tmp_path_factory.mktemp("main") / "run"
    fresh, _ = counted("scale_ablation.main", *main_args(workdir))
    finished, out = counted("scale_ablation.main", *main_args(workdir))
    assert "already finished" in out
    extended, _ = counted("scale_ablation.main", *main_args(workdir, **{"train.steps": 12}),
                          "--extend")
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["steps_completed"] == 12
    return {"fresh": fresh, "finished": finished, "extended": extended}


def test_a_fresh_run_validates_and_builds_its_model_once(main_counts):
    once_per_run(main_counts["fresh"], runs=1, reads=0)  # no config.json yet


def test_a_finished_run_reads_its_config_json_once(main_counts):
    once_per_run(main_counts["finished"], runs=1, reads=1)


def test_an_extended_run_reads_its_config_json_once(main_counts):
    once_per_run(main_counts["extended"], runs=1, reads=1)


@pytest.fixture(scope="module")
def sweep_counts(tmp_path_factory) -> tuple[dict, dict, str, str]:
    root = tmp_path_factory.mktemp("sweep")
    spec = root / "two_points.py"
    spec.write_text(EXPERIMENT)
    sweep_dir = root / "sweep"
    fresh, out = counted("scale_ablation.sweep", f"--config={spec}", f"--workdir={sweep_dir}",
                         "--noreport")
    extended, out_extended = counted("scale_ablation.sweep", f"--config={spec}:longer",
                          f"--workdir={sweep_dir}", "--noreport", "--extend")
    for point in GRID:
        name = experiment.run_name(point)
        assert json.loads((sweep_dir / name / "summary.json").read_text())["steps_completed"] == 9
    return fresh, extended, out, out_extended


@pytest.mark.slow  # two sweeps in subprocesses, ~1 min; the main run's checks above are not
def test_a_sweep_validates_and_builds_each_model_once(sweep_counts):
    fresh, _, out, _ = sweep_counts
    once_per_run(fresh, runs=len(GRID), reads=0)
    assert re.search(rf"^\[sweep\] group 1: {len(GRID)} runs, at most \d+ members", out, re.M)


@pytest.mark.slow  # two sweeps in subprocesses, ~1 min; the main run's checks above are not
def test_an_extended_sweep_reads_each_config_json_once(sweep_counts):
    _, extended, _, out = sweep_counts
    once_per_run(extended, runs=len(GRID), reads=len(GRID))
    assert f"[sweep] ensemble of {len(GRID)}:" in out  # extended, they train together still
