"""launch/cpu_studies.sh, the programme that reruns the CPU studies: it names every study whose
published report still lacks its run files, and refuses bad input in one line."""

from __future__ import annotations

import pathlib
import re
import subprocess

import pytest
from helpers import REPO

SCRIPT = REPO / "launch" / "cpu_studies.sh"
RESULTS = REPO / "experiments" / "results"


def listing() -> dict[str, str]:
    out = subprocess.run(["bash", str(SCRIPT), "--list"], capture_output=True, text=True,
                         check=True).stdout
    return dict(line.split(": ", 1) for line in out.splitlines())


def test_every_cpu_study_without_run_files_is_in_the_programme():
    # a sweep's report has a summary.csv (the coord check's folder is not one)
    unfinished = {p.parent.name for p in RESULTS.glob("*_cpu/summary.csv")
                  if not (p.parent / "run_files").is_dir()}
    assert unfinished <= set(listing())


def test_each_study_runs_its_own_experiment_file_into_its_own_folder():
    for study, command in listing().items():
        config = re.search(r"--config=(\S+?):cpu", command).group(1)
        assert (REPO / config).is_file(), command
        assert f"--workdir=runs/{study}" in command
        # the published folder's name is the study's, its experiment file the study's root
        assert study == pathlib.Path(config).stem + "_cpu", command


@pytest.mark.parametrize("args, names", [(["no_such_study"], "unknown study no_such_study"),
                                         (["--resume"], "unknown flag --resume")])
def test_bad_input_is_one_line_exit_2(args, names):
    done = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          cwd=REPO)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and names in done.stderr
