r"""A published study in W&B: a W&B run per run of its store, grouped by the study.

  python -m scale_ablation.wandb_study experiments/results/headline [--out=runs/wandb/headline]
  wandb sync runs/wandb/headline/*/wandb/offline-run-*     # offline (no login): upload later

Each run of experiments/results/STUDY/runs.parquet (`records.study_store`) becomes a W&B run
named after it, in group STUDY, job type "published", tagged `policy=...` and `d_k=...` as a
sweep tags its runs, with the run's config, its metrics rows as history (at their steps) and its
summary.json as summary. W&B is offline unless you are logged in (`wandb.mode` auto; `--mode`
overrides); each run's W&B folder goes under OUT/RUN/wandb. `report --wandb_workspace` on a
sweep directory of the same study names the same group, so its workspace shows these runs. A
run whose folder is already under OUT is skipped (rerun to finish an interrupted load).
"""

from __future__ import annotations

import os
import sys

from absl import flags

from scale_ablation import command_line
from scale_ablation.records import study_store
from scale_ablation.records.wandb_tracker import WANDB_MODES, WandbSettings, WandbTracker

JOB_TYPE = "published"
USAGE = "python -m scale_ablation.wandb_study STUDY_DIR [--out=DIR] [--mode=auto|offline|online]"


def run_settings(study: str, run: study_store.RunRecord, mode: str) -> WandbSettings:
    """The run's W&B settings: its config's project and entity, the study as group."""
    model = run.config.get("model", {})
    d_k = model.get("qk_dim") or model.get("head_dim")
    return WandbSettings.of(run.config.get("wandb"), mode=mode, group=study, job_type=JOB_TYPE,
                            name=run.name,
                            tags=(f"policy={run.config.get('policy')}", f"d_k={d_k}"))


def load(study_dir: str, out: str, mode: str = "auto") -> list[str]:
    """Write a W&B run for each run of STUDY_DIR's store under OUT; return the run names
    written (those already under OUT are skipped)."""
    path = study_store.store_path(study_dir)
    if path is None:
        raise ValueError(f"{study_dir} holds no {study_store.STORE_FILE}")
    if mode not in WANDB_MODES:
        raise ValueError(f"--mode must be one of {', '.join(WANDB_MODES)}; got {mode!r}")
    study = os.path.basename(os.path.normpath(study_dir))
    written = []
    for run in study_store.read_store(path).runs:
        if os.path.exists(workdir := os.path.join(out, run.name)):
            continue
        tracker = WandbTracker(workdir, run.config, run_settings(study, run, mode))
        for row in run.metrics:
            tracker.log(row["step"], {k: v for k, v in row.items() if k != "step"})
        tracker.summary(run.summary or {})
        tracker.finish()
        written.append(run.name)
    return written


def main(argv: list[str], out: str | None = None, mode: str = "auto") -> int:
    study_dir = argv[1]
    out = out or os.path.join("runs", "wandb", os.path.basename(os.path.normpath(study_dir)))
    try:
        names = load(study_dir, out, mode)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"{len(names)} runs of {study_dir} written to {out} as W&B runs")
    return 0


if __name__ == "__main__":
    # Flags defined only when run: a process that imports several commands (the tests) would
    # otherwise meet two definitions of --out.
    flags.DEFINE_string("out", None, "Where the W&B runs go (default runs/wandb/STUDY).")
    flags.DEFINE_string("mode", "auto", "W&B mode: auto (online when logged in), offline or online.")
    command_line.start(lambda argv: main(argv, flags.FLAGS.out, flags.FLAGS.mode),
                       positionals=1, usage=USAGE)
