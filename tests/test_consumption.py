"""What a sweep consumed: wall time summed over ensembles (each member carries its ensemble's),
tokens and FLOPs over runs, the machine named."""

from __future__ import annotations

import pytest

from scale_ablation.analysis import consumption

CPU = {"device_kind": "cpu", "device_count": 1, "host_cpus": 2}


def member(ensemble, seconds, tokens=100, flops=1e9):
    return {"ensemble": ensemble, "wall_seconds": seconds, "tokens_seen": tokens,
            "train_flops": flops, "environment": CPU}


def test_an_ensemble_counts_once_at_its_longest_member():
    # a: three members, one stopped early (diverged) at 7 s; b: alone; one run from before
    # ensembles were recorded; one interrupted run with no wall time.
    summaries = [member("a", 10.0), member("a", 7.0), member("a", 10.0), member("b", 5.0),
                 {"wall_seconds": 99.0, "tokens_seen": 100, "train_flops": 1e9},
                 {"status": "interrupted"}]
    assert consumption.wall_seconds(summaries) == (15.0, 2, 2)
    (line,) = consumption.lines(summaries)
    assert line == ("Consumed: 6 runs, 500 tokens, 5e+09 train FLOPs; wall time 0.00 h summed "
                    "over 2 ensemble(s) (2 run(s) without an ensemble record or wall time not "
                    "in it), on cpu, 2 host CPUs.")


def test_runs_from_before_the_ensemble_record_give_no_wall_time():
    summaries = [{"wall_seconds": 10.0, "tokens_seen": 100, "train_flops": 1e9}] * 2
    assert consumption.lines(summaries) == [
        "Consumed: 2 runs, 200 tokens, 2e+09 train FLOPs; wall time not recorded by these runs."]


def test_a_machine_recorded_with_and_without_its_cpus_is_named_once():
    old = {"device_kind": "cpu", "device_count": 1}  # before host_cpus was recorded
    summaries = [member("a", 10.0), {**member("b", 5.0), "environment": old}]
    assert consumption.lines(summaries)[0].endswith(", on cpu, 2 host CPUs.")


@pytest.mark.parametrize("environment, named", [
    ({"device_kind": "NVIDIA H200", "device_count": 8}, "NVIDIA H200 ×8"),
    ({"device_kind": "cpu", "device_count": 1}, "cpu"),  # recorded before host_cpus
])
def test_the_machine_is_named_as_recorded(environment, named):
    assert consumption.machine(environment) == named
