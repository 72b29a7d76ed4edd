"""The u-μP transfer study (experiments/umup_transfer.py): its grid (each parametrisation on its
own LR scale), its quick width sweep end to end, and a coordinate check under u-μP on the quick
model: unit scale at initialisation, flat across widths after a few steps at u-μP's LR."""

import json
import subprocess
import sys

import numpy as np
import pytest
from helpers import REPO, swept_rows

from experiments import umup_transfer
from scale_ablation.analysis import transfer
from scale_ablation.training import coordinates


def test_each_parametrisation_runs_its_own_grid_at_every_width():
    for arg in ("quick", "cpu", None):
        points = umup_transfer.sweep(arg)
        widths, *_ = umup_transfer.SIZES[arg]
        for parametrization, policy in umup_transfer.SETTINGS:
            seeds = umup_transfer.seeds_of(parametrization, arg)
            spec = umup_transfer.policy_spec(policy, arg)
            for width in widths:
                lrs = sorted(p["train.lr"] for p in points if p["policy"] == spec
                             and p["model.parametrization"] == parametrization
                             and p["model.d_model"] == width)
                assert lrs == sorted(umup_transfer.lrs(parametrization, arg) * len(seeds))
    # Seeds 2-4 at cpu for u-μP alone: 126 runs beside the first 114.
    more = 2 * 3 * len(umup_transfer.lrs("umup", "cpu")) * 3  # settings × widths × LRs × seeds
    assert len(umup_transfer.sweep("cpu")) == 114 + more
    # u-μP's η is absolute (a weight's step η/√fan_in on N(0, 1)): its grid lies above μP's.
    assert min(umup_transfer.lrs("umup", "cpu")) > max(umup_transfer.lrs("mup", "cpu"))


@pytest.mark.slow  # ~20 s on 2 cores: 12 runs of 10 steps
def test_quick_width_sweep_runs_end_to_end(tmp_path):
    rows = swept_rows(f"{REPO}/experiments/umup_transfer.py:quick", tmp_path)
    assert len(rows) == len(umup_transfer.sweep("quick"))
    assert all(r["status"] == "completed" for r in rows)
    found = transfer.optima(rows)
    assert set(found) == {(p, umup_transfer.policy_spec(policy, "quick"))
                          for p, policy in umup_transfer.SETTINGS}
    assert all(sorted(by_width) == [32, 64] for by_width in found.values())


def slope(widths, values) -> float:
    return float(np.polyfit(np.log(widths), np.log(values), 1)[0])


@pytest.mark.slow  # ~20 s on 2 cores: 3 widths × 6 steps
def test_quick_coordinate_check_under_umup(tmp_path):
    """At step 1 (the initialisation) every activation family is unit-scaled (mean |x| of
    N(0, 1) is 0.8) and the readout's 1/fan_in gives output logits ~1/√width; after 5 steps at
    u-μP's LR the families have grown several-fold, by the same factor at every width."""
    widths = [32, 64, 128]
    result = subprocess.run(
        [sys.executable, "-m", "scale_ablation.coord_check",
         f"--config={REPO}/experiments/umup_transfer.py:quick", "--parametrizations=umup",
         f"--widths={','.join(map(str, widths))}", "--steps=6", "--seeds=1",
         "--config.train.lr=0.5", "--config.wandb.mode=disabled", f"--out={tmp_path}"],
        capture_output=True, text=True, cwd=REPO, timeout=900)
    assert result.returncode == 0, result.stderr[-2000:]
    data = json.loads((tmp_path / "coord_check.json").read_text())["umup"]
    first = {q: [data[str(w)][q][0] for w in widths] for q in coordinates.QUANTITIES}
    last = {q: [data[str(w)][q][-1] for w in widths] for q in coordinates.QUANTITIES}
    for quantity in ("embedding", "attn_output", "mlp_output", "residual"):
        assert all(0.5 < value < 1.5 for value in first[quantity]), (quantity, first[quantity])
    for quantity in ("attn_output", "mlp_output", "residual"):  # the blocks have learned
        assert min(b / a for a, b in zip(first[quantity], last[quantity], strict=True)) > 2, \
            quantity
    assert slope(widths, first["output_logits"]) == pytest.approx(-0.5, abs=0.1)
    for quantity in ("embedding", "attn_output", "mlp_output", "residual", "output_logits"):
        assert abs(slope(widths, last[quantity])) < coordinates.SLOPE_TOLERANCE, quantity
    verdicts = json.loads((tmp_path / "verdicts.json").read_text())
    assert verdicts["policy"] == {"umup": "inv_dk"}  # u-μP's own attention, mult/d_head
