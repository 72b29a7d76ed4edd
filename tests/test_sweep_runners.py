"""The sweep's runner splits an ensemble group into programs of at most N members (issue 31):
N from the device's memory by the planner's rule, or `--max_members`.

The device's memory is faked (a few runs' worth) around the peak that the planner's memory
analysis measures for the tiny run: N is then known from the law the rule states (N runs'
peaks within its share of the memory), and the runner's split is compared with it and with
the number of programs that `--plan` prints for the same points.
"""

from __future__ import annotations

import dataclasses
import re

import pytest
from helpers import TINY_RUN, experiment_source

from scale_ablation import sweep
from scale_ablation.sweeping import plan_text, planner, sweep_runners
from scale_ablation.training import ensemble

SEEDS = 6
GRID = [{"train.seed": seed} for seed in range(SEEDS)]  # one ensemble group of six
FIT = 4  # members the fake memory holds: programs of 4 and 2


@pytest.fixture(scope="module")
def points(tmp_path_factory):
    root = tmp_path_factory.mktemp("split")
    spec = root / "six_seeds.py"
    spec.write_text(experiment_source("Six seeds of the tiny run.", TINY_RUN, repr(GRID)))
    return sweep.expand(str(spec), str(root / "sweep"))


@pytest.fixture(scope="module")
def peak(points) -> int:
    return planner.shape_cost(points[0].config).peak_bytes


@pytest.fixture
def small_device(monkeypatch, peak):
    """This machine's device with room for FIT and a half runs in its memory share."""
    real = planner.device

    def fake(name=None, *, measure=True):
        dev = real("cpu", measure=measure)
        return dataclasses.replace(dev, memory_bytes=(FIT + 0.5) * peak / planner.MEMORY_SHARE)

    monkeypatch.setattr(planner, "device", fake)


def groups_of(points, sweep_dir) -> list[list[int]]:
    return ensemble.group([p.config for p in points], [sweep_dir / p.name for p in points],
                          [p.checked for p in points])


def test_a_group_of_six_splits_into_what_the_memory_holds(points, small_device, tmp_path,
                                                          capsys):
    groups = groups_of(points, tmp_path)
    assert groups == [list(range(SEEDS))]
    split = sweep_runners.split_groups(points, groups)
    # The law: FIT runs' peaks fit in the share, FIT + 1 do not; full programs first.
    assert split == [list(range(FIT)), list(range(FIT, SEEDS))]
    assert f"at most {FIT} members a program" in capsys.readouterr().out


def test_the_split_agrees_with_the_plan(points, small_device, tmp_path, capsys):
    split = sweep_runners.split_groups(points, groups_of(points, tmp_path))
    capsys.readouterr()
    assert plan_text.run(points, "six seeds", True, None, "cpu") == 0
    text = capsys.readouterr().out
    (fit, programs), = re.findall(r"(\d+) fit a program; (\d+) programs", text)
    assert (int(fit), int(programs)) == (FIT, len(split))


@pytest.mark.parametrize("most", [1, 3, 5, SEEDS])
def test_max_members_sets_n(points, tmp_path, most, capsys):
    split = sweep_runners.split_groups(points, groups_of(points, tmp_path), most)
    assert [len(program) for program in split] == [
        min(most, SEEDS - start) for start in range(0, SEEDS, most)]
    assert sorted(i for program in split for i in program) == list(range(SEEDS))
    assert "(--max_members)" in capsys.readouterr().out


@pytest.mark.parametrize("overrides", [
    {},
    {"model.num_heads": 1, "model.head_dim": 64, "data.seq_len": 64},
    {"policy": "qk_layernorm", "model.mlp_ratio": 1, "train.batch_size": 8},
])
def test_the_analytic_bound_lies_above_the_compiled_peak(points, overrides):
    """The runner skips the memory analysis when `peak_bound` says a group fits: safe only
    while the bound over-estimates what XLA's memory analysis reports."""
    config = points[0].config.copy_and_resolve_references()
    for key, value in overrides.items():
        node, _, leaf = key.rpartition(".")
        (config[node] if node else config)[leaf] = value
    assert planner.peak_bound(config) >= planner.shape_cost(config).peak_bytes


def test_a_group_that_surely_fits_compiles_nothing(points, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(planner, "shape_cost", lambda *a, **k: pytest.fail("compiled"))
    split = sweep_runners.split_groups(points, groups_of(points, tmp_path))
    assert split == [list(range(SEEDS))]
    assert "fits: at most" in capsys.readouterr().out
