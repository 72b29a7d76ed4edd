"""The published coordinate checks' README tables are their verdicts.json, not typed numbers."""

from __future__ import annotations

import json
import pathlib
import re

RESULTS = pathlib.Path(__file__).parent.parent / "experiments" / "results"
PUBLISHED = RESULTS / "mup_coord_check_cpu"
HEAD_DIM = RESULTS / "mup_head_dim_coord_check_cpu"
HEAD_DIM_RUNS = (HEAD_DIM, HEAD_DIM / "lr_0.01_steps_20")  # the README's two tables, in order
HEAD_DIM_ARMS = ("sp:inv_sqrt_dk", "mup", "mup:inv_sqrt_dk")
UMUP = RESULTS / "umup_coord_check_cpu"
# The README table's columns, in order: (arm, the run folder that checked it).
UMUP_ARMS = (("umup", "umup_lr_0.5"), ("umup:inv_sqrt_dk", "umup_lr_0.5"), ("mup", "mup_lr_0.01"))


def test_the_slope_table_is_the_published_verdicts():
    verdicts = json.loads((PUBLISHED / "verdicts.json").read_text())["slopes"]
    rows = re.findall(r"^\| `(\w+)` \| (\S+) \((\w+)\) \| (\S+) \((\w+)\) \|$",
                      (PUBLISHED / "README.md").read_text(), re.MULTILINE)
    assert {name for name, *_ in rows} == set(verdicts["sp"]) == set(verdicts["mup"])
    for name, sp_slope, sp_verdict, mup_slope, mup_verdict in rows:
        for parametrization, slope, verdict in (("sp", sp_slope, sp_verdict),
                                                ("mup", mup_slope, mup_verdict)):
            found = verdicts[parametrization][name]
            assert float(slope) == round(found["slope"], 2) + 0.0, (parametrization, name)
            assert verdict == found["verdict"], (parametrization, name)


def test_the_check_reproduces_the_published_shape():
    """SP's attention output and output logits grow with width; under μP nothing grows."""
    verdicts = json.loads((PUBLISHED / "verdicts.json").read_text())["slopes"]
    assert verdicts["sp"]["attn_output"]["verdict"] == "grows"
    assert verdicts["sp"]["output_logits"]["verdict"] == "grows"
    assert {v["verdict"] for v in verdicts["mup"].values()} == {"flat"}


def test_the_head_dim_tables_are_the_published_verdicts():
    """Each table of the head-dim check's README, in order, is its run's verdicts.json."""
    cell = r" (\S+) \((\w+)\) \|"
    rows = re.findall(r"^\| `(\w+)` \|" + cell * 3 + "$", (HEAD_DIM / "README.md").read_text(),
                      re.MULTILINE)
    quantities = len(rows) // len(HEAD_DIM_RUNS)
    assert quantities and len(rows) == quantities * len(HEAD_DIM_RUNS)
    for index, run in enumerate(HEAD_DIM_RUNS):
        verdicts = json.loads((run / "verdicts.json").read_text())
        assert (verdicts["axis"], list(verdicts["slopes"])) == ("head_dim", list(HEAD_DIM_ARMS))
        table = rows[index * quantities:(index + 1) * quantities]
        assert {name for name, *_ in table} == set(verdicts["slopes"]["mup"]), run
        for name, *cells in table:
            for arm, slope, verdict in zip(HEAD_DIM_ARMS, cells[::2], cells[1::2], strict=True):
                found = verdicts["slopes"][arm][name]
                assert float(slope) == round(found["slope"], 2) + 0.0, (run, arm, name)
                assert verdict == found["verdict"], (run, arm, name)


def test_along_the_head_dim_sp_grows_and_mup_does_not():
    """SP's attention output and residual grow with the head dim; under head-dim μP nothing
    grows, and with 1/d_k its logits are flat once trained (the longer run)."""
    for run in HEAD_DIM_RUNS:
        slopes = json.loads((run / "verdicts.json").read_text())["slopes"]
        assert slopes["sp:inv_sqrt_dk"]["attn_output"]["verdict"] == "grows"
        assert slopes["sp:inv_sqrt_dk"]["residual"]["verdict"] == "grows"
        for arm in ("mup", "mup:inv_sqrt_dk"):
            assert "grows" not in {v["verdict"] for q, v in slopes[arm].items()
                                   if q != "attn_logits"}, (run, arm)
    longer = json.loads((HEAD_DIM_RUNS[1] / "verdicts.json").read_text())["slopes"]
    assert longer["mup"]["attn_logits"]["verdict"] == "flat"
    assert longer["mup:inv_sqrt_dk"]["attn_logits"]["verdict"] == "grows"


def test_the_umup_table_is_the_published_verdicts():
    """The u-μP check's README table: each column is its run's verdicts.json."""
    cell = r" (\S+) \((\w+)\) \|"
    rows = re.findall(r"^\| `(\w+)` \|" + cell * len(UMUP_ARMS) + "$",
                      (UMUP / "README.md").read_text(), re.MULTILINE)
    slopes = {arm: json.loads((UMUP / run / "verdicts.json").read_text())["slopes"][arm]
              for arm, run in UMUP_ARMS}
    assert rows and {name for name, *_ in rows} == set(slopes["mup"]) == set(slopes["umup"])
    for name, *cells in rows:
        for (arm, _), slope, verdict in zip(UMUP_ARMS, cells[::2], cells[1::2], strict=True):
            assert float(slope) == round(slopes[arm][name]["slope"], 2) + 0.0, (arm, name)
            assert verdict == slopes[arm][name]["verdict"], (arm, name)


def test_umup_keeps_width_flat_but_its_own_logits():
    """Under u-μP nothing grows with width; with mult/d_head its logits shrink, with 1/√d_k
    they do not; μP is flat everywhere."""
    slopes = {arm: json.loads((UMUP / run / "verdicts.json").read_text())["slopes"][arm]
              for arm, run in UMUP_ARMS}
    for arm in ("umup", "umup:inv_sqrt_dk"):
        assert "grows" not in {v["verdict"] for v in slopes[arm].values()}, arm
        assert {v["verdict"] for q, v in slopes[arm].items() if q != "attn_logits"} == {"flat"}
    assert slopes["umup"]["attn_logits"]["verdict"] == "shrinks"
    assert slopes["umup:inv_sqrt_dk"]["attn_logits"]["slope"] > slopes["umup"]["attn_logits"][
        "slope"]
    assert {v["verdict"] for v in slopes["mup"].values()} == {"flat"}
