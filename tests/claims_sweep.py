"""A small sweep directory with claims and known verdicts, written without training: the run
files a sweep leaves (config.json, metrics.jsonl, summary.json; sweep.json, refined.json), each
run's numbers a closed-form function of its policy, LR and seed.

Two policies × three LRs × three seeds, plus one refine round (LR 2e-3, three seeds each):
- inv_sqrt_dk (the reference) ends LEARNED below the bigram baseline, best near 3e-3, smooth at
  every LR;
- none ends at the bigram baseline or above (not learning) at 1e-3, 2e-3 and 3e-3 and diverges at
  1e-2.
Its experiment file's three claims: none is worse (at its best LR), none does not train smoothly,
inv_sqrt_dk trains smoothly. The complete directory supports all three (`COMPLETE`).
"""

from __future__ import annotations

import json
import math
import pathlib

from experiments import base
from scale_ablation.analysis import baselines
from scale_ablation.records.run_files import RunFiles
from scale_ablation.training import experiment_files as experiment

POLICIES = ("inv_sqrt_dk", "none")
LRS = (1e-3, 3e-3, 1e-2)
REFINED_LR = 2e-3
SEEDS = (0, 1, 2)
STEPS = 60
LEARNED = 0.8  # bits per byte below the bigram baseline, the reference's best
COMPLETE = ["supported", "supported", "supported"]

EXPERIMENT = '''
from experiments import base
from scale_ablation.analysis import claims as c

def get_config(arg=None):
    config = base.get_config("quick")
    config.train.steps = {steps}
    config.wandb.mode = "disabled"
    return config

def sweep(arg=None):
    return [{{"policy": p, "train.lr": lr, "train.seed": s}}
            for p in {policies!r} for lr in {lrs!r} for s in {seeds!r}]

def claims(arg=None):
    return [
        c.Claim("none is worse", c.Compare("worse", policies=("none",), at="best_lr")),
        c.Claim("none does not train smoothly", c.Unstable(("none",), expect_unstable=True)),
        c.Claim("inv_sqrt_dk trains smoothly", c.Unstable(("inv_sqrt_dk",), expect_unstable=False)),
    ]
'''


def config_for(overrides: dict) -> dict:
    config = experiment.apply_overrides(base.get_config("quick"), overrides).to_dict()
    config["train"]["steps"] = STEPS
    config["wandb"]["mode"] = "disabled"
    return config


def bigram_bpb() -> float:
    return baselines.baselines(config_for({}))["bigram_bpb"]


def final_bpb(policy: str, lr: float, seed: int, bigram: float) -> float:
    shape = 0.2 * abs(math.log10(lr / 3e-3)) + 0.01 * seed
    if policy == "none":
        return bigram + 0.1 + shape + 0.013 * seed * seed
    return bigram - LEARNED + shape


def write_run(sweep: pathlib.Path, overrides: dict, bigram: float) -> dict:
    policy, lr, seed = overrides["policy"], overrides["train.lr"], overrides["train.seed"]
    name = experiment.run_name(overrides)
    files = RunFiles(sweep / name)
    files.write_config(config_for(overrides))
    diverges = policy == "none" and lr >= 1e-2
    final = final_bpb(policy, lr, seed, bigram)
    last = STEPS // 2 if diverges else STEPS
    for step in range(0, last + 1, 10):
        bpb = final + (8 - final) * math.exp(-step / 10)
        files.append_metrics(step, {"train/loss": bpb * math.log(2) + 0.01,
                                    "val/loss": bpb * math.log(2), "val/bpb": bpb})
    if diverges:
        files.append_metrics(last + 1, {"train/loss": math.nan})
        summary = {"status": "diverged", "steps_completed": last + 1,
                   "diverged_at_step": last + 1, "final_val_bpb": None, "final_val_loss": None}
    else:
        summary = {"status": "completed", "steps_completed": STEPS, "final_val_bpb": final,
                   "final_val_loss": final * math.log(2), "diverged_at_step": None}
    files.write_summary(summary)
    return {"name": name, "overrides": overrides, "status": summary["status"]}


def grid() -> list[dict]:
    return [{"policy": p, "train.lr": lr, "train.seed": s}
            for p in POLICIES for lr in LRS for s in SEEDS]


def build(root: pathlib.Path) -> pathlib.Path:
    """The complete sweep directory under `root` (its experiment file beside it)."""
    spec = root / "claims_experiment.py"
    spec.write_text(EXPERIMENT.format(steps=STEPS, policies=POLICIES, lrs=LRS, seeds=SEEDS))
    sweep = root / "sweep"
    bigram = bigram_bpb()
    entries = [write_run(sweep, point, bigram) for point in grid()]
    refined = []
    for policy in POLICIES:
        for seed in SEEDS:
            parent = {"policy": policy, "train.lr": 3e-3, "train.seed": seed}
            overrides = {**parent, "train.lr": REFINED_LR}
            entries.append(write_run(sweep, overrides, bigram))
            refined.append({"name": experiment.run_name(overrides), "overrides": overrides,
                            "parent": experiment.run_name(parent)})
    (sweep / "refined.json").write_text(json.dumps({"rounds": [refined]}))
    (sweep / "sweep.json").write_text(json.dumps(
        {"config": str(spec), "imports": [], "runs": entries}))
    return sweep


def verdicts(claims_md: str) -> list[str]:
    import re
    return re.findall(r"Verdict[^\n]*?: \*\*(\w+(?: \w+)?)\*\*", claims_md)
