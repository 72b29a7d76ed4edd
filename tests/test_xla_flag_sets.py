"""benchmarks/xla_flag_sets: each figure is the median of its rounds, and bad flags are one line
and exit 2 before anything is measured or written."""

import statistics
import subprocess
import sys

from helpers import REPO

from benchmarks import xla_flag_sets


def _row(flag_set: str, members: int, rate: float) -> dict:
    return {"shape": "dk_exponent", "flag_set": flag_set, "members": members,
            "program": "map", "run_steps_per_s": rate, "compile_s": rate / 10}


def test_each_measurement_is_the_median_of_its_rounds():
    rates = {("default", 1): [10.0, 14.0, 11.0], ("no_ynn", 16): [30.0, 20.0, 40.0]}
    rounds = [[_row(name, k, got[i]) for (name, k), got in rates.items()] for i in range(3)]
    rows = {(r["flag_set"], r["members"]): r for r in xla_flag_sets.medians(rounds)}
    for key, got in rates.items():
        assert rows[key]["run_steps_per_s"] == statistics.median(got)
        assert rows[key]["rounds"] == got  # in the rounds' order
        assert rows[key]["compile_s"] == statistics.median(g / 10 for g in got)


def test_every_flag_set_is_measured_beside_the_default():
    assert xla_flag_sets.FLAG_SETS["default"] == ""
    assert len(set(xla_flag_sets.FLAG_SETS.values())) == len(xla_flag_sets.FLAG_SETS)


def test_bad_flags_are_one_line_and_exit_2(tmp_path):
    out = tmp_path / "table.json"
    for bad in ("--shapes=nowhere", "--members=0", "--members=a", "--rounds=0"):
        done = subprocess.run([sys.executable, "-m", "benchmarks.xla_flag_sets", bad,
                               f"--out={out}"], cwd=REPO, capture_output=True, text=True)
        assert done.returncode == 2, bad
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert not out.exists()
