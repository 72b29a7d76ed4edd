"""The main job's learning rates are the ones dk_exponent_cpu located for its cell, computed
again here from that study's published summary.csv by `analysis.located`, and its configuration
is that study's, so that they carry (issue 54: each policy at its own located LR)."""

from __future__ import annotations

import math

import pandas as pd
from helpers import REPO

from experiments import dk_exponent, headline
from scale_ablation.analysis import located

SUMMARY = REPO / "experiments" / "results" / "dk_exponent_cpu" / "summary.csv"


def located_lr(rows: pd.DataFrame) -> float:
    by_lr = {(lr,): {int(r.seed): r.final_val_bpb for r in runs.itertuples()}
             for lr, runs in rows.groupby("lr")}
    found = located.locate(by_lr)
    assert found.edge is None and found.fitted, "the LR is not interior in dk_exponent_cpu"
    return math.exp(found.log_star)


def test_the_learning_rates_are_located_in_dk_exponent():
    rows = pd.read_csv(SUMMARY)
    cell = rows[(rows["override:model.init"] == headline.INIT) & (rows["d_k"] == headline.QK_DIM)]
    for policy, lr in headline.LOCATED_LRS.items():
        runs = cell[cell["policy"] == headline.SOURCE_POLICY[policy]]
        assert len(runs) >= 9, policy
        assert float(f"{located_lr(runs):.2g}") == lr, policy


def test_the_configuration_is_dk_exponents_cell():
    ours, theirs = headline.get_config().to_dict(), dk_exponent.get_config("cpu").to_dict()
    assert (ours["model"]["qk_dim"], ours["model"]["init"]) == (headline.QK_DIM, headline.INIT)
    for section in ("model", "train", "optimizer", "data"):
        if section not in theirs:
            continue
        differ = {k for k in theirs[section] if ours[section].get(k) != theirs[section][k]}
        allowed = {"model": {"qk_dim", "init"}, "data": {"test_bytes"}}.get(section, set())
        assert differ <= allowed, (section, differ - allowed)
