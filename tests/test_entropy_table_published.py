"""The published entropy table (experiments/results/entropy_table/README.md) is the probe's own
output, not typed: its tables are its CSV's numbers, and rerunning the command it names, cut to
its d_k = 16 row (the draws depend on (seed, d_k) only, so a row regenerates alone), gives the
same numbers, the printed-beside-measured rows included."""

from __future__ import annotations

import ast
import csv
import re
import shlex

import pytest
from helpers import REPO

from scale_ablation.training import experiment_files as experiment

PUBLISHED = REPO / "experiments" / "results" / "entropy_table"
README = PUBLISHED / "README.md"


def rows_under(text: str, heading: str) -> list[list[str]]:
    """The cells of the markdown table under `heading`, past its header and rule."""
    section = text.split(heading, 1)[1]
    lines = re.findall(r"^\|(.*)\|$", section.split("\n## ", 1)[0], re.MULTILINE)
    return [[c.strip().strip("*") for c in line.split("|")] for line in lines][2:]


def table_rows(text: str, heading: str) -> dict[str, list[str]]:
    """d_k -> the other cells, of the table under `heading`."""
    return {row[0]: row[1:] for row in rows_under(text, heading)}


def beside_rows(text: str) -> list[list[str]]:
    return rows_under(text, "## The article's printed numbers")


def published_command() -> tuple[str, dict]:
    """(experiment spec, --config.x overrides) of the command the README names."""
    line = next(line.strip() for line in README.read_text().splitlines()
                if line.strip().startswith("python -m scale_ablation.main"))
    args = shlex.split(line)
    spec = next(a.split("=", 1)[1] for a in args if a.startswith("--config="))
    overrides = {a.split("=", 1)[0].removeprefix("--config."): ast.literal_eval(a.split("=", 1)[1])
                 for a in args if a.startswith("--config.")}
    return spec, overrides


def test_the_tables_are_the_csv_numbers():
    with open(PUBLISHED / "entropy_table.csv") as f:
        cells = list(csv.DictReader(f))
    text = README.read_text()
    for field, heading in (("entropy", "## Softmax entropy"), ("max_weight", "## Mean max weight")):
        table = table_rows(text, heading)
        for d_k, row in table.items():
            measured = [f"{float(c[field]):.3f}" for c in cells if c["d_k"] == d_k]
            assert row[:-1] == measured, (field, d_k)  # the last column repeats the diagonal
        assert len(table) * len(table[next(iter(table))][:-1]) == len(cells)


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory):
    spec, overrides = published_command()
    module, arg = experiment.load_module(f"{REPO}/{spec}")
    config = module.get_config(arg)
    for key, value in overrides.items():
        setattr(config, key, value)
    config.head_dims = (16,)
    out = tmp_path_factory.mktemp("entropy_table")
    module.run(config, str(out))
    return out


def test_the_d_k_16_row_regenerates(regenerated):
    text, again = README.read_text(), (regenerated / "entropy_table.md").read_text()
    for heading in ("## Softmax entropy", "## Mean max weight"):
        published, fresh = table_rows(text, heading)["16"], table_rows(again, heading)["16"]
        assert len(published) == len(fresh)
        for a, b in zip(published, fresh, strict=True):
            assert abs(float(a) - float(b)) <= 1.5e-3, heading  # a last digit may round apart


def test_the_printed_beside_measured_rows_regenerate(regenerated):
    published = [r for r in beside_rows(README.read_text()) if r[1] == "16"]
    fresh = beside_rows((regenerated / "entropy_table.md").read_text())
    assert len(published) == len(fresh) >= 4  # ÷1, ÷√d_k, ÷d_k, ÷10 at d_k = 16
    for a, b in zip(published, fresh, strict=True):
        assert a[:4] == b[:4]  # the article's words, d_k, divisor, printed number
        for x, y in zip(a[4:], b[4:], strict=True):
            assert abs(float(x) - float(y)) <= 1.5e-3, a
