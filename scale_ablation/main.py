r"""Train one run: `python -m scale_ablation.main --config=experiments/base.py --workdir=DIR`.

Override any field with `--config.FIELD=VALUE` (e.g. `--config.policy=none`). Rerunning the
same command on the same workdir resumes from the latest checkpoint. Exit codes: 0 completed or
diverged (both are results), 1 failed, 2 bad input, 3 preempted (resume by rerunning).
"""

from __future__ import annotations

import sys

from absl import app, flags, logging
from ml_collections import config_flags

from scale_ablation import experiment, runtime
from scale_ablation.train import ConfigError, train

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment file, path.py[:variant].",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (created if missing).")
_DISTRIBUTED = flags.DEFINE_enum(
    "distributed", "auto", ["auto", "on", "off"],
    "Call jax.distributed.initialize(): auto = when launched under Slurm with several tasks or "
    "on a multi-host TPU slice.",
)
EXIT_CODES = {"completed": 0, "diverged": 0, "failed": 1, "preempted": 3}


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    if _CONFIG.value is None or not _WORKDIR.value:
        print("error: --config and --workdir are required", file=sys.stderr)
        return 2
    config = _CONFIG.value
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
    runtime.maybe_initialize(_DISTRIBUTED.value)
    if config.train.get("compilation_cache", True):
        runtime.enable_compilation_cache(_WORKDIR.value)
    try:
        # Probes (no training) define `run(config, workdir)` in their experiment file.
        module, _ = experiment.load_module(flags.FLAGS["config"].config_filename)
        if hasattr(module, "run"):
            module.run(config, _WORKDIR.value)
            return 0
        summary = train(config, _WORKDIR.value)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"{summary['status']}: {_WORKDIR.value} after {summary['steps_completed']} steps, "
          f"final val bpb {summary.get('final_val_bpb')}", flush=True)
    return EXIT_CODES[summary["status"]]


if __name__ == "__main__":
    app.run(lambda argv: sys.exit(main(argv)))
