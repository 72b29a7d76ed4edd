"""The sweep runner end to end on a tiny experiment: statuses, divergence, kill and resume,
dry runs, bad grids, parallel subprocesses.

Checks compare with what the runner does not compute itself: the grid written here, each run's
own summary.json, the bytes and mtimes of finished runs before and after a rerun, the metrics a
killed run had logged, and an uninterrupted run of the point that was killed.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import pathlib
import re
import signal
import subprocess
import sys

import pytest
from helpers import TINY_MODEL, built_once, experiment_source, read_json, shared_root

from scale_ablation import report, sweep
from scale_ablation.training import experiment_files as experiment
from scale_ablation.training import hooks

REPO = pathlib.Path(__file__).resolve().parents[1]
ENV = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}

# Found by trying, 20 steps of this tiny model with grad_clip 0 and no warmup: in float32 lr 10
# completes (val loss ~250), lr 100 diverges at step 9 (none and inv_sqrt_dk alike), lr 1e4 at
# step 4. (float16, policy none, d_k 256: lr 1 diverges at step 4, lr 0.1 completes.)
DIVERGING = {"train.lr": 1e4, "train.grad_clip": 0.0, "train.warmup_steps": 0}

GRIDS = {
    # For the report: two learning rates of one policy (an LR-sensitivity group), a second d_k
    # with two layers and a learned scale, and a run that diverges.
    "report": [
        {"policy": "inv_sqrt_dk", "train.lr": 3e-3},
        {"policy": "inv_sqrt_dk", "train.lr": 1e-2},
        {"policy": "learned", "train.lr": 3e-3, "model.head_dim": 32, "model.num_layers": 2},
        {"policy": "none", **DIVERGING},
    ],
    # A short run, then a long one with checkpoints every 10 steps to kill mid-way.
    "resume": [
        {"policy": "inv_sqrt_dk"},
        {"policy": "inv_dk", "train.steps": 200},
    ],
    "bad_field": [{"policy": "none"}, {"model.no_such_field": 1}],
    "bad_policy": [{"policy": "inv_sqrt_dk"}, {"policy": "no_such_policy"}],
    "bad_type": [{"policy": "none"}, {"train.lr": "fast"}],
    "bad_norm": [{"model.norm": "bogus"}],
    # A valid config, refused by train() when it opens the data, before it writes anything.
    "no_data": [{"data.source": "text:no_such_corpus.txt"}],
}
GRIDS["parallel"] = GRIDS["resume"] + GRIDS["no_data"]
KILL_AT = 55  # the step of the "resume" grid's second run after which the sweep is killed
REPORT_STATUSES = ["completed", "completed", "completed", "diverged"]

EXPERIMENT = experiment_source(
    "A tiny experiment for tests/test_sweep.py and tests/test_report.py.",
    {**TINY_MODEL, "train.steps": 20, "train.warmup_steps": 2,
     "train.log_every": 5, "train.eval_every": 5, "train.diag_every": 5,
     "checkpoint.every": 10, "wandb.mode": "offline"},
    f"{GRIDS!r}[arg.removesuffix('_wider')]",
    when_arg="""
        if arg == "parallel_wider":  # the "parallel" grid after an edit of the experiment
            config.model.d_model = 48
    """)


def write_experiment(directory: pathlib.Path) -> pathlib.Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "tiny_experiment.py"
    if not path.exists():
        path.write_text(EXPERIMENT)
    return path


def build_report_sweep(tmp_path_factory) -> pathlib.Path:
    """The "report" grid run in this process, as `sweep.main` would, report included.

    Built once per run of the suite: test_report.py calls this too, and every pytest process
    reuses the one the first built (the tests only read it).
    """
    return built_once(shared_root(tmp_path_factory) / "report_grid", run_report_grid) / "sweep"


def run_report_grid(root: pathlib.Path) -> None:
    sweep_dir = root / "sweep"
    spec = f"{write_experiment(root)}:report"
    points = sweep.expand(spec, str(sweep_dir))
    sweep.write_sweep_file(str(sweep_dir), spec, points)
    complete = sweep.run_in_process(str(sweep_dir), points, sweep.Progress(len(points), 0))
    assert complete
    sweep.write_sweep_file(str(sweep_dir), spec, points)
    report.write_report(str(sweep_dir))


def run_sweep(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "scale_ablation.sweep", *args],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
    )




def tree(directory: pathlib.Path) -> dict[str, int]:
    """Every path under `directory` with its mtime, to see that nothing was written."""
    return {str(p.relative_to(directory)): p.stat().st_mtime_ns for p in directory.rglob("*")}


def checkpoint_steps(run_dir: pathlib.Path) -> list[int]:
    directory = run_dir / "checkpoints"
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if re.fullmatch(r"\d+", p.name))


def printed_steps(stdout: str, total: int) -> list[int]:
    """The steps of the sweep's progress lines for a run of `total` steps (the first step a
    process trains and the last are always printed)."""
    return [int(m) for m in re.findall(rf"^\[sweep\] .+?: step (\d+)/{total}\b", stdout,
                                       re.MULTILINE)]


# --------------------------------------------------------------------------- in process


@pytest.fixture(scope="session")
def report_sweep(tmp_path_factory) -> pathlib.Path:
    return build_report_sweep(tmp_path_factory)


def test_sweep_file_lists_every_point_with_its_status(report_sweep):
    record = read_json(report_sweep / "sweep.json")
    assert record["config"].endswith("tiny_experiment.py:report")
    assert [r["overrides"] for r in record["runs"]] == GRIDS["report"]
    assert [r["status"] for r in record["runs"]] == REPORT_STATUSES
    names = [r["name"] for r in record["runs"]]
    assert len(set(names)) == len(names)
    for entry in record["runs"]:
        summary = read_json(report_sweep / entry["name"] / "summary.json")
        assert summary["status"] == entry["status"]
        config = read_json(report_sweep / entry["name"] / "config.json")
        for key, value in entry["overrides"].items():
            node = config
            for part in key.split("."):
                node = node[part]
            assert node == value, f"{entry['name']}: {key} = {node!r}, want {value!r}"
        # Runs of a sweep are grouped in W&B by the sweep directory's name.
        assert config["wandb"]["group"] == report_sweep.name


def test_the_diverging_point_diverges_and_the_others_complete(report_sweep):
    record = read_json(report_sweep / "sweep.json")
    for entry in record["runs"]:
        summary = read_json(report_sweep / entry["name"] / "summary.json")
        rows = [
            json.loads(line)
            for line in (report_sweep / entry["name"] / "metrics.jsonl").read_text().splitlines()
        ]
        if entry["overrides"].get("train.lr") == DIVERGING["train.lr"]:
            step = summary["diverged_at_step"]
            assert summary["status"] == "diverged" and 1 <= step < 20
            # The run's log ends at the step it diverged, flagged.
            assert rows[-1]["step"] == step and rows[-1]["train/diverged"] == 1.0
            loss = rows[-1]["train/loss"]
            assert loss is None or not math.isfinite(loss) or loss > 1e6
        else:
            assert summary["status"] == "completed" and summary["diverged_at_step"] is None
            assert summary["steps_completed"] == 20 and rows[-1]["step"] == 20
            assert math.isfinite(summary["final_val_bpb"])


def test_a_rerun_in_process_touches_no_finished_run(report_sweep):
    # sweep.main leaves finished runs out; even handed them, the runner must not redo them.
    spec = f"{report_sweep.parent / 'tiny_experiment.py'}:report"
    points = sweep.expand(spec, str(report_sweep))
    before = {k: v for k, v in tree(report_sweep).items() if not k.startswith("report")}
    outcomes = {}
    assert sweep.run_in_process(str(report_sweep), points, sweep.Progress(4, 0), outcomes)
    assert [outcomes[p.name] for p in points] == REPORT_STATUSES
    after = {k: v for k, v in tree(report_sweep).items() if not k.startswith("report")}
    assert after == before


# --------------------------------------------------------------------------- the CLI


@pytest.fixture(scope="module")
def experiment_file(tmp_path_factory) -> pathlib.Path:
    return write_experiment(tmp_path_factory.mktemp("experiment"))


@pytest.fixture(scope="module")
def killed_and_resumed(experiment_file, tmp_path_factory) -> dict:
    """The "resume" grid: SIGKILLed after step KILL_AT of its second run (hooks.SIGNAL_AT_ENV:
    the first run has fewer steps and never gets there), then rerun."""
    sweep_dir = tmp_path_factory.mktemp("killed") / "sweep"
    args = (f"--config={experiment_file}:resume", f"--workdir={sweep_dir}")
    first, second = (sweep_dir / experiment.run_name(o) for o in GRIDS["resume"])
    process = subprocess.Popen(
        [sys.executable, "-m", "scale_ablation.sweep", *args],
        cwd=REPO,
        env={**ENV, hooks.SIGNAL_AT_ENV: f"{KILL_AT}:SIGKILL"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: the cleanup takes wandb's helper too
    )
    try:
        output, _ = process.communicate(timeout=300)
    finally:
        with contextlib.suppress(ProcessLookupError):  # a helper left in the group
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    assert process.returncode == -signal.SIGKILL, output.decode()[-3000:]
    killed_output = output.decode()
    assert not (second / "summary.json").exists()
    assert max(checkpoint_steps(second)) == KILL_AT // 10 * 10

    before = {
        "first": {
            name: ((first / name).read_bytes(), (first / name).stat().st_mtime_ns)
            for name in ("summary.json", "metrics.jsonl", "config.json")
        },
        "second_metrics": (second / "metrics.jsonl").read_text().splitlines(),
        "second_checkpoint": max(checkpoint_steps(second)),
    }
    dry_before = tree(sweep_dir)
    dry_run = run_sweep(*args, "--dry_run")
    dry_after = tree(sweep_dir)
    rerun = run_sweep(*args)
    return {
        "dir": sweep_dir,
        "first": first,
        "second": second,
        "killed_output": killed_output,
        "before": before,
        "dry_run": dry_run,
        "dry_run_changed": dry_before != dry_after,
        "rerun": rerun,
    }


@pytest.mark.slow  # a sweep killed and rerun in subprocesses, ~25 s for the three; a run's resume: test_train.py
def test_kill_then_rerun_keeps_finished_runs_and_resumes_the_killed_one(killed_and_resumed):
    state = killed_and_resumed
    rerun, first, second = state["rerun"], state["first"], state["second"]
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert "[sweep] policy=inv_sqrt_dk" in state["killed_output"]

    # The finished run is not redone: same bytes, same mtimes.
    for name, (content, mtime) in state["before"]["first"].items():
        assert (first / name).read_bytes() == content, name
        assert (first / name).stat().st_mtime_ns == mtime, name
    assert "[sweep] policy=inv_sqrt_dk\n" not in rerun.stdout

    # The killed run resumes from its latest checkpoint: nothing before it is trained again...
    checkpoint = state["before"]["second_checkpoint"]
    steps = printed_steps(rerun.stdout, 200)
    assert steps and steps[0] > checkpoint and steps[-1] == 200, (checkpoint, steps)
    # ...its log up to the checkpoint is kept as it was, and no step is logged twice.
    rows = [json.loads(line) for line in (second / "metrics.jsonl").read_text().splitlines()]
    logged = [row["step"] for row in rows]
    assert logged == sorted(set(logged)) and logged[-1] == 200
    kept = [
        line for line in state["before"]["second_metrics"] if json.loads(line)["step"] <= checkpoint
    ]
    assert kept and (second / "metrics.jsonl").read_text().splitlines()[: len(kept)] == kept

    summary = read_json(second / "summary.json")
    assert summary["status"] == "completed" and summary["steps_completed"] == 200
    record = read_json(state["dir"] / "sweep.json")
    assert [r["status"] for r in record["runs"]] == ["completed", "completed"]
    assert (state["dir"] / "report" / "summary.md").exists()


@pytest.mark.slow  # a sweep killed and rerun in subprocesses, ~25 s for the three; a run's resume: test_train.py
def test_dry_run_of_a_started_sweep_lists_statuses_and_writes_nothing(killed_and_resumed):
    dry_run = killed_and_resumed["dry_run"]
    assert dry_run.returncode == 0, dry_run.stderr
    lines = dry_run.stdout.splitlines()
    first, second = killed_and_resumed["first"].name, killed_and_resumed["second"].name
    assert any(line.split() == ["completed", first] for line in lines), dry_run.stdout
    assert any(line.split()[-1:] == [second] and "completed" not in line for line in lines)
    assert lines[-1] == "2 runs, 1 to run"
    assert not killed_and_resumed["dry_run_changed"]


def test_dry_run_of_a_new_sweep_lists_the_runs_and_creates_nothing(experiment_file, tmp_path):
    sweep_dir = tmp_path / "never"
    result = run_sweep(f"--config={experiment_file}:report", f"--workdir={sweep_dir}", "--dry_run")
    assert result.returncode == 0, result.stderr
    for overrides in GRIDS["report"]:
        name = experiment.run_name(overrides)
        assert re.search(rf"^\s+pending\s+{re.escape(name)}$", result.stdout, re.MULTILINE)
        # The command that would run it, with every override as a flag.
        command = next(
            line for line in result.stdout.splitlines() if f"--workdir={sweep_dir / name} " in line
        )
        for key, value in overrides.items():
            assert f"--config.{key}={value}" in command
    assert result.stdout.splitlines()[-1] == "4 runs, 4 to run"
    assert not sweep_dir.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("passed", [(), ("--verbose",), ("--verbose", "--extend")])
def test_run_processes_get_the_sweeps_own_flags(experiment_file, tmp_path, passed):
    """`--parallel` runs each point as `main`: the sweep's --verbose and --extend go with it."""
    result = run_sweep(f"--config={experiment_file}:report", f"--workdir={tmp_path / 'plan'}",
                       "--dry_run", *passed)
    assert result.returncode == 0, result.stderr
    commands = [line.split() for line in result.stdout.splitlines() if "scale_ablation.main" in line]
    assert len(commands) == len(GRIDS["report"])
    for words in commands:
        assert {w for w in words if w in ("--verbose", "--extend")} == set(passed)


@pytest.mark.parametrize(
    ("grid", "named"),
    [("bad_field", "no_such_field"), ("bad_policy", "no_such_policy"), ("bad_type", "train.lr"),
     ("bad_norm", "model.norm")],
)
def test_a_bad_grid_exits_2_with_one_line_and_creates_nothing(
    experiment_file, tmp_path, grid, named
):
    sweep_dir = tmp_path / "bad"
    result = run_sweep(f"--config={experiment_file}:{grid}", f"--workdir={sweep_dir}")
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and named in lines[0], lines
    assert result.stdout == ""
    assert not sweep_dir.exists()


def test_a_run_refused_by_train_is_recorded_failed(experiment_file, tmp_path):
    sweep_dir = tmp_path / "refused"
    result = run_sweep(f"--config={experiment_file}:no_data", f"--workdir={sweep_dir}")
    assert result.returncode == sweep.EXIT_INCOMPLETE, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert "no_such_corpus" in result.stdout and "failed=1" in result.stdout
    record = read_json(sweep_dir / "sweep.json")
    assert [r["status"] for r in record["runs"]] == ["failed"]
    assert not (sweep_dir / record["runs"][0]["name"]).exists()


@pytest.fixture(scope="module")
def parallel_sweep(experiment_file, tmp_path_factory) -> tuple[pathlib.Path, object]:
    sweep_dir = tmp_path_factory.mktemp("parallel") / "sweep"
    result = run_sweep(
        f"--config={experiment_file}:parallel",
        f"--workdir={sweep_dir}",
        "--parallel=2",
        "--noreport",
    )
    return sweep_dir, result


def test_parallel_runs_each_point_in_its_own_process(parallel_sweep):
    sweep_dir, result = parallel_sweep
    assert result.returncode == sweep.EXIT_INCOMPLETE, result.stdout + result.stderr
    record = read_json(sweep_dir / "sweep.json")
    assert [r["overrides"] for r in record["runs"]] == GRIDS["parallel"]
    assert [r["status"] for r in record["runs"]] == ["completed", "completed", "failed"]
    for entry, steps in zip(record["runs"][:2], (20, 200), strict=True):
        summary = read_json(sweep_dir / entry["name"] / "summary.json")
        assert summary["status"] == "completed" and summary["steps_completed"] == steps
        # Each run's own `scale_ablation.main` process logged its end here.
        log = (sweep_dir / f"{entry['name']}.log").read_text()
        assert f"completed: {sweep_dir / entry['name']} after {steps} steps" in log
    refused = record["runs"][2]["name"]
    assert "no_such_corpus" in (sweep_dir / f"{refused}.log").read_text()
    assert not (sweep_dir / refused).exists()
    assert not (sweep_dir / "report").exists()  # --noreport


@pytest.mark.slow  # a sweep killed and rerun in subprocesses, ~25 s for the three; a run's resume: test_train.py
def test_the_resumed_run_ends_where_an_uninterrupted_one_does(killed_and_resumed, parallel_sweep):
    uninterrupted = read_json(
        parallel_sweep[0] / killed_and_resumed["second"].name / "summary.json"
    )
    resumed = read_json(killed_and_resumed["second"] / "summary.json")
    for key in ("final_val_loss", "final_train_loss"):
        assert resumed[key] == pytest.approx(uninterrupted[key], rel=1e-5), key


def test_a_changed_experiment_is_refused_on_its_finished_runs(experiment_file, parallel_sweep):
    sweep_dir = parallel_sweep[0]
    before = tree(sweep_dir)
    result = run_sweep(f"--config={experiment_file}:parallel_wider", f"--workdir={sweep_dir}")
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "model.d_model" in lines[0], lines
    assert tree(sweep_dir) == before


def test_parallel_runs_get_their_own_gpu(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    gpus = sweep.visible_gpus()
    assert gpus == ["2", "5"]
    assert [sweep.process_env(slot, gpus)["CUDA_VISIBLE_DEVICES"] for slot in range(3)] == [
        "2", "5", "2"
    ]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU visible: nothing to hand out
    assert sweep.visible_gpus() == []
    assert sweep.process_env(0, [])["CUDA_VISIBLE_DEVICES"] == ""
