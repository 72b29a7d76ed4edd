"""`sweep --refine` end to end on a synthetic sweep: the real command (grid, refined.json,
locks, report), with the in-process runner replaced by one that writes each run's files at
once, its final loss a known parabola in log10(lr) per policy. The checks recompute, from the
run directories alone, that each setting's best LR ends interior and bracketed at ×√2; a
sweep stopped part way and rerun ends with the same runs, each run once."""

from __future__ import annotations

import json
import math
import os
import pathlib
import shutil
import subprocess
import sys

import pytest
from helpers import REPO, experiment_source

OPTIMA = {"inv_sqrt_dk": 2.3e-3, "none": 7e-4}  # the parabolas' vertices
LRS, SEEDS = (1e-3, 4e-3, 1.6e-2), (0, 1)  # ×4: inv_sqrt_dk interior, none at the low edge
GRID = [{"policy": p, "train.lr": lr, "train.seed": s} for p in OPTIMA for lr in LRS for s in SEEDS]
STEPS = 60

RUNNER = f'''
"""A stand-in for the in-process runner: each point's files, its final loss a parabola."""
import math, os
from scale_ablation.records.run_files import RunFiles

OPTIMA, STEPS = {OPTIMA!r}, {STEPS}
done = 0  # runs written by this process


def final_bpb(policy, lr, seed):
    return 3.0 + 0.4 * (math.log10(lr) - math.log10(OPTIMA[policy])) ** 2 + 0.02 * seed


def run_in_process(sweep_dir, todo, progress, outcomes=None, **kwargs):
    global done
    for point in todo:
        if done == int(os.environ.get("FAKE_STOP_AFTER", "-1")):
            return False  # as if preempted
        config = point.config
        files = RunFiles(os.path.join(sweep_dir, point.name))
        files.write_config(config.to_dict())
        bpb = final_bpb(config.policy, config.train.lr, config.train.seed)
        for step, value in ((0, 8.0), (STEPS, bpb)):
            files.append_metrics(step, {{"val/loss": value * math.log(2), "val/bpb": value}})
        files.write_summary({{"status": "completed", "steps_completed": STEPS,
                              "final_val_bpb": bpb, "final_val_loss": bpb * math.log(2)}})
        with open(os.path.join(sweep_dir, "fake_runs.log"), "a") as log:
            log.write(point.name + "\\n")
        done += 1
        if outcomes is not None:
            outcomes[point.name] = "completed"
    return True
'''

DRIVER = """
import os
import sys
sys.path.insert(0, sys.argv.pop(1))
sys.path.insert(1, os.getcwd())  # the repository, as `python -m` from it puts it: `experiments`
import fake_runner
from absl import app
from scale_ablation import sweep
sweep.run_in_process = fake_runner.run_in_process
app.run(lambda argv: sys.exit(sweep.main(argv)))
"""


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("refine")
    (root / "fake_runner.py").write_text(RUNNER)
    (root / "driver.py").write_text(DRIVER)
    (root / "experiment.py").write_text(experiment_source(
        "A synthetic LR grid for tests/test_refine.py.",
        {"train.steps": STEPS, "wandb.mode": "disabled"}, repr(GRID)))
    return root


def refine(root: pathlib.Path, sweep_dir: pathlib.Path, *flags: str,
           stop_after: int | None = None,
           config: str = "experiment.py") -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "disabled"}
    if stop_after is not None:
        env["FAKE_STOP_AFTER"] = str(stop_after)
    return subprocess.run(
        [sys.executable, str(root / "driver.py"), str(root), f"--config={root / config}",
         f"--workdir={sweep_dir}", "--refine", *flags],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def runs_on_disk(sweep_dir: pathlib.Path) -> dict[str, tuple[str, float, int]]:
    """Run name -> (policy, lr, seed), read from each run's config.json."""
    out = {}
    for config_path in sweep_dir.glob("*/config.json"):
        config = json.loads(config_path.read_text())
        out[config_path.parent.name] = (config["policy"], config["train"]["lr"],
                                        config["train"]["seed"])
    return out


def assert_interior_and_bracketed(sweep_dir: pathlib.Path, seeds: int = len(SEEDS)) -> None:
    """From the run files alone: per policy, every LR has every seed, the best mean loss is
    not at an end of the grid, and both neighbours are within ×√2 of it."""
    by_policy: dict[str, dict[float, list[float]]] = {}
    for name, (policy, lr, _) in runs_on_disk(sweep_dir).items():
        summary = json.loads((sweep_dir / name / "summary.json").read_text())
        by_policy.setdefault(policy, {}).setdefault(lr, []).append(summary["final_val_bpb"])
    assert set(by_policy) == set(OPTIMA)
    for policy, by_lr in by_policy.items():
        assert all(len(values) == seeds for values in by_lr.values()), policy
        lrs = sorted(by_lr)
        best = min(range(len(lrs)), key=lambda i: sum(by_lr[lrs[i]]))
        assert 0 < best < len(lrs) - 1, (policy, lrs)
        ratio = max(lrs[best] / lrs[best - 1], lrs[best + 1] / lrs[best])
        assert ratio <= math.sqrt(2) * (1 + 1e-4), (policy, lrs)


@pytest.fixture(scope="module")
def refined(files) -> tuple[pathlib.Path, subprocess.CompletedProcess]:
    sweep_dir = files / "uninterrupted"
    return sweep_dir, refine(files, sweep_dir)


def test_refine_ends_interior_and_bracketed(refined):
    sweep_dir, result = refined
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[refine] every setting is interior and bracketed at ×√2 after" in result.stdout
    assert_interior_and_bracketed(sweep_dir)
    assert len(runs_on_disk(sweep_dir)) > len(GRID)
    # Each added LR is printed on the line of its setting, and refined.json lists its runs.
    rounds = json.loads((sweep_dir / "refined.json").read_text())["rounds"]
    added = [entry for round_ in rounds for entry in round_]
    assert {e["name"] for e in added} == set(runs_on_disk(sweep_dir)) - {
        ",".join(f"{k.split('.')[-1]}={v}" for k, v in point.items()) for point in GRID}
    for entry in added:
        lr = entry["overrides"]["train.lr"]
        assert any(f"{entry['overrides']['policy']} d_k=32:" in line and f"{lr:.6g}" in line
                   for line in result.stdout.splitlines() if "adds LR" in line), entry


def test_the_report_locates_each_optimum_inside_its_bracket(refined):
    sweep_dir, _ = refined
    text = (sweep_dir / "report" / "summary.md").read_text()
    table = text.split("## Best learning rate per setting", 1)[1].split("\n\n## ", 1)[0]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()
            if line.startswith("| ") and not line.startswith("| policy")]
    assert {row[0] for row in rows} == set(OPTIMA)
    for policy, _, located, best, bracket, *_ in rows:
        # The losses are an exact parabola in log10(lr): the fitted vertex is its vertex.
        assert float(located.split(" ")[0]) == pytest.approx(OPTIMA[policy], rel=2e-3)
        assert float(bracket.removeprefix("×")) <= math.sqrt(2) * 1.001
        assert abs(math.log(float(best) / OPTIMA[policy])) <= math.log(2) / 2


@pytest.mark.slow  # a refine stopped and rerun in subprocesses, ~20 s; the rounds: above
def test_a_stopped_refine_resumes_and_runs_each_point_once(files, refined):
    sweep_dir = files / "stopped"
    first = refine(files, sweep_dir, "--refine_rounds=1", stop_after=len(GRID) + 2)
    assert first.returncode == 3, first.stdout + first.stderr  # stopped in round 1
    assert "rerun the same command to continue" in first.stdout
    capped = refine(files, sweep_dir, "--refine_rounds=1")
    assert capped.returncode == 0, capped.stdout + capped.stderr
    assert "not added: --refine_rounds=1 rounds are recorded" in capped.stdout
    assert len(json.loads((sweep_dir / "refined.json").read_text())["rounds"]) == 1
    rest = refine(files, sweep_dir)
    assert rest.returncode == 0, rest.stdout + rest.stderr
    assert_interior_and_bracketed(sweep_dir)
    assert runs_on_disk(sweep_dir) == runs_on_disk(refined[0])
    log = (sweep_dir / "fake_runs.log").read_text().split()
    assert sorted(log) == sorted(runs_on_disk(sweep_dir))  # each run trained once
    again = refine(files, sweep_dir)
    assert again.returncode == 0 and (sweep_dir / "fake_runs.log").read_text().split() == log


def test_seeds_added_to_a_refined_sweep_fill_every_lr_of_its_curves(files, refined):
    """A seed added to the experiment file runs at the grid's LRs; --refine then runs it at
    the refined LRs too, whatever --refine_rounds says, so that each curve is located on all
    its seeds (else the new seed would be left out of every curve)."""
    sweep_dir = files / "more_seeds"
    shutil.copytree(refined[0], sweep_dir)
    more = GRID + [{"policy": p, "train.lr": lr, "train.seed": 2} for p in OPTIMA for lr in LRS]
    (files / "more_seeds.py").write_text(experiment_source(
        "The synthetic grid with a third seed.",
        {"train.steps": STEPS, "wandb.mode": "disabled"}, repr(more)))
    before = runs_on_disk(sweep_dir)
    result = refine(files, sweep_dir, "--refine_rounds=1", config="more_seeds.py")
    assert result.returncode == 0, result.stdout + result.stderr
    refined_lrs = {lr for (_, lr, _) in before.values()} - set(LRS)
    fills = len({(p, lr) for (p, lr, _) in before.values() if lr not in LRS})  # one seed each
    assert refined_lrs and f"[refine] {fills} runs complete the seed × LR grid of their " \
        "curves (seed 2)" in result.stdout
    seeds_at: dict[tuple[str, float], set[int]] = {}
    for policy, lr, seed in runs_on_disk(sweep_dir).values():
        seeds_at.setdefault((policy, lr), set()).add(seed)
    assert all(seeds == {0, 1, 2} for seeds in seeds_at.values()), seeds_at
    log = (sweep_dir / "fake_runs.log").read_text().split()
    assert sorted(log) == sorted(runs_on_disk(sweep_dir))  # each run trained once
    assert_interior_and_bracketed(sweep_dir, seeds=3)
