"""benchmarks/mutation.py's list stays runnable: every original snippet occurs exactly once in
its file, and every listed test file exists (the run itself is on demand, ~13 minutes)."""

import pathlib

from benchmarks import mutation

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_every_snippet_occurs_once():
    assert mutation.check_snippets(mutation.MUTATIONS) == []


def test_the_list_covers_the_core_and_names_existing_tests():
    assert len(mutation.MUTATIONS) >= 20
    assert len({m.name for m in mutation.MUTATIONS}) == len(mutation.MUTATIONS)
    areas = {m.area for m in mutation.MUTATIONS}
    assert {"policies", "attention", "model", "train step", "optimiser", "data", "report",
            "sharding", "checkpoints"} <= areas
    for m in mutation.MUTATIONS:
        files = [t.split("::")[0] for t in m.tests if t.startswith("tests/")]
        assert files and all((REPO / f).is_file() for f in files), m.name
        assert all(original != replacement for _, original, replacement in m.edits), m.name
