"""Published benchmark results name paths relative to the repository: they are read on other
machines, where this checkout's absolute path means nothing."""

import os

from helpers import REPO

from benchmarks import arrangement_check


def test_no_results_file_names_this_checkouts_absolute_path():
    results = REPO / "benchmarks" / "results"
    found = [p.name for p in sorted(results.iterdir())
             if p.is_file() and str(REPO.resolve()) in p.read_text(errors="replace")]
    assert not found


def test_the_arrangement_check_writes_paths_in_the_repository_relative_to_it():
    absolute = os.path.join(str(arrangement_check.REPO), "runs", "slice.py:cpu")
    written = arrangement_check.in_repo(f"plan: {absolute} (39 runs)")
    assert written == "plan: runs/slice.py:cpu (39 runs)"
    assert arrangement_check.in_repo("/elsewhere/x") == "/elsewhere/x"
    assert arrangement_check.in_repo(None) is None
