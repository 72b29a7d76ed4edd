"""launch/cpu_studies.sh, the programme that reruns the CPU studies: it names every study whose
published report still lacks its runs (a study store), and refuses bad input in one line."""

from __future__ import annotations

import json
import pathlib
import re
import shutil
import subprocess

import pytest
from helpers import REPO

from scale_ablation import publish
from scale_ablation.records import jsonfiles, study_store

SCRIPT = REPO / "launch" / "cpu_studies.sh"
RESULTS = REPO / "experiments" / "results"


def listing() -> dict[str, str]:
    out = subprocess.run(["bash", str(SCRIPT), "--list"], capture_output=True, text=True,
                         check=True).stdout
    return dict(line.split(": ", 1) for line in out.splitlines())


def test_every_cpu_study_without_its_runs_is_in_the_programme():
    # a sweep's report has a summary.csv (the coord check's folder is not one)
    unfinished = {p.parent.name for p in RESULTS.glob("*_cpu/summary.csv")
                  if study_store.store_path(str(p.parent)) is None}
    assert unfinished <= set(listing())


def test_each_study_runs_its_own_experiment_file_into_its_own_folder():
    for study, command in listing().items():
        config = re.search(r"--config=(\S+?):cpu", command).group(1)
        assert (REPO / config).is_file(), command
        assert f"--workdir=runs/{study}" in command
        # the published folder's name is the study's, its experiment file the study's root
        assert study == pathlib.Path(config).stem + "_cpu", command


@pytest.mark.parametrize("args, names", [
    (["no_such_study"], "unknown study no_such_study"),
    (["--resume"], "unknown flag --resume (flags: --list, --plan, --commit, --retrain)"),
    (["--retrain"], "--retrain needs the studies to train anew, by name")])
def test_bad_input_is_one_line_exit_2(args, names):
    done = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          cwd=REPO)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and names in done.stderr


def test_the_script_counts_finished_runs_as_publish_does(tmp_path):
    """Its trigger for a new stash (a grep over summary.json) against `publish.finished_runs`
    (the JSON read), on the headline's runs beside a preempted one and one never finished."""
    sweep = tmp_path / "sweep"
    headline = REPO / "experiments" / "results" / "scale_one_fan_in" / study_store.STORE_FILE
    study_store.write_run_dirs(study_store.read_store(str(headline)), str(sweep))
    preempted = sweep / "policy=none,lr=0.03,seed=0"
    shutil.copytree(sweep / "policy=none,lr=0.001,seed=0", preempted)
    summary = json.loads((preempted / "summary.json").read_text())
    jsonfiles.write_json_atomic(preempted / "summary.json", {**summary, "status": "preempted"})
    (sweep / "policy=none,lr=0.1,seed=0").mkdir()
    function = re.search(r"^count_finished\(\) \{.*?^\}", SCRIPT.read_text(), re.M | re.S).group(0)
    counted = subprocess.run(["bash", "-c", f"set -euo pipefail\n{function}\n"
                              f"count_finished {sweep}; count_finished {tmp_path / 'none'}"],
                             capture_output=True, text=True, check=True).stdout.split()
    assert counted == [str(len(publish.finished_runs(str(sweep)))), "0"]
    assert counted[0] == "6"


def test_a_retrain_trains_apart_from_the_published_runs(tmp_path):
    """--retrain's folder is runs/STUDY.retrain, which is never seeded from the published runs
    (the workdir function and the seeding line, run as the script defines them)."""
    text = SCRIPT.read_text()
    function = re.search(r"^workdir\(\) \{.*?\}$", text, re.M).group(0)
    seeding = re.search(r"^ *\[\[ -f \$published/runs.parquet \]\] .*$", text, re.M).group(0)
    (tmp_path / study_store.STORE_FILE).write_bytes(b"")  # a published study's store
    for retrain, folder, seeded in ((0, "runs/s", "seeded"), (1, "runs/s.retrain", "")):
        done = subprocess.run(
            ["bash", "-c", f"set -euo pipefail\n{function}\nretrain={retrain}\n"
             f"published={tmp_path}\ndir=$(workdir s)\nextract() {{ echo seeded; }}\n"
             f"{seeding}\necho $dir"],
            capture_output=True, text=True, check=True).stdout.split()
        assert done == ([seeded] if seeded else []) + [folder]
