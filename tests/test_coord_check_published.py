"""The published coordinate check's README table is its verdicts.json, not typed numbers."""

from __future__ import annotations

import json
import pathlib
import re

PUBLISHED = pathlib.Path(__file__).parent.parent / "experiments" / "results" / "mup_coord_check_cpu"


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
