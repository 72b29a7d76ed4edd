r"""Train one run: `python -m scale_ablation.main --config=experiments/base.py --workdir=DIR`.

Override any field with `--config.FIELD=VALUE` (e.g. `--config.policy=none`); a policy of your
own is one `--imports=my_policy.py` away (`scale_ablation.model.plugins`). Rerunning the
same command on the same workdir resumes from the latest intact checkpoint. A run already
trained with other steps, warmup or lr (`config.SCHEDULE_FIELDS`) is refused unless `--extend`
asks to continue it with the new ones. One process at a time trains a workdir (a lock). Exit
codes: 0 completed or diverged (both are results), 1 failed (a full disk included), 2 bad input
(a workdir in use included), 3 preempted (resume by rerunning).
"""

from __future__ import annotations

import errno
import logging as stdlib_logging
import os
import sys

import jax
from absl import flags, logging
from ml_collections import config_flags

from scale_ablation import command_line
from scale_ablation.errors import ConfigError
from scale_ablation.model import plugins
from scale_ablation.records import checkpoints
from scale_ablation.records.checkpoints import CheckpointError
from scale_ablation.records.run_files import FINISHED
from scale_ablation.training import experiment_files as experiment
from scale_ablation.training import hooks, run_setup, runtime
from scale_ablation.training.train import train

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment file, path.py[:variant].",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (created if missing).")
_DISTRIBUTED = flags.DEFINE_enum(
    "distributed", "auto", ["auto", "on", "off"],
    "Call jax.distributed.initialize(): auto = when launched under Slurm with several tasks or "
    "on a multi-host TPU slice, or when --coordinator_address is given.",
)
_EXTEND = flags.DEFINE_bool(
    "extend", False, "Continue a run (finished or not) trained with other train.steps, "
    "train.warmup_steps or train.lr from its last checkpoint with the new values.")
_IMPORTS = plugins.imports_flag()
_VERBOSE = flags.DEFINE_bool("verbose", False, "Show W&B's own console lines (banners per run).")
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", None,
    "HOST:PORT of process 0's coordinator, for processes not started by Slurm or on a TPU "
    "slice (e.g. several processes on one machine); needs --num_processes and --process_id.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes in the program.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's rank, 0-based.")
_HEARTBEAT = flags.DEFINE_integer(
    "heartbeat_timeout", runtime.Cluster.heartbeat_timeout,
    "Seconds after which a silent process counts as dead and the others stop with an error.")
_SHUTDOWN = flags.DEFINE_integer(
    "shutdown_timeout", runtime.Cluster.shutdown_timeout,
    "Seconds JAX's shutdown barrier waits at exit; a finished process first waits for every "
    "live peer to finish (their heartbeats tell a slow peer from a dead one).")
EXIT_CODES = {"completed": 0, "diverged": 0, "failed": 1, "preempted": 3}


def main(argv: list[str]) -> int:
    if _CONFIG.value is None or not _WORKDIR.value:
        print("error: --config and --workdir are required", file=sys.stderr)
        return 2
    spec = flags.FLAGS["config"].config_filename
    # The process edge: everything process-wide is set here, nowhere in the library.
    runtime.make_experiments_importable(spec)
    runtime.normalise_environment(verbose=_VERBOSE.value)
    checkpoints.quiet_failed_restores()
    # On a full disk W&B's own log file fails too; each failed write would print a traceback.
    stdlib_logging.raiseExceptions = False
    try:
        plugins.load(_IMPORTS.value)  # before the config's policy is looked up
        # Before the config is touched: config_flags defers a missing file's error to first use,
        # where it surfaces as a traceback.
        module, _ = experiment.load_module(spec)
        probe = experiment.is_probe(module)
        extra_hooks = hooks.hooks_from_environment(dict(os.environ))
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    config = _CONFIG.value
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
    if probe:
        return _run_probe(module, config)
    cluster = runtime.Cluster(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value,
                              _HEARTBEAT.value, _SHUTDOWN.value)
    try:
        cluster.check()
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    watch = runtime.maybe_initialize(_DISTRIBUTED.value, cluster)
    try:
        # Before the compile cache (a directory beside the workdir) is set up. The one
        # validation of this command and its one read of config.json, handed down to `train`.
        checked = run_setup.check_before_start(config, _WORKDIR.value, extend=_EXTEND.value)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if config.train.get("compilation_cache", True):
        runtime.enable_compilation_cache(_WORKDIR.value)
    if watch is not None:  # a hung peer: its partners record these members failed
        extra_hooks = [*extra_hooks, hooks.Periodic(1, watch.record, reads_state=False)]
    return _train(config, extra_hooks, checked)


def _train(config, extra_hooks, checked: run_setup.Checked) -> int:
    """The run, with each way it can end turned into one line and an exit code."""
    try:
        before = run_setup.read_summary(_WORKDIR.value)
        summary = train(config, _WORKDIR.value, extra_hooks=extra_hooks, extend=_EXTEND.value,
                        checked=checked)
    except OSError as error:
        if error.errno != errno.ENOSPC:
            raise
        # The run recorded itself failed where the disk let it (loop.run_members).
        print(f"error: no space left on device ({error.filename or _WORKDIR.value}): free "
              "space and rerun to resume", file=sys.stderr, flush=True)
        return 1
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        if isinstance(error.__cause__, CheckpointError):
            # A failed restore leaves orbax's other reads in flight; at interpreter exit they
            # print warnings and tracebacks that add nothing to the line above. Nothing of
            # ours needs tearing down (no run file was opened), so leave at once.
            os._exit(2)
        return 2
    except jax.errors.JaxRuntimeError as error:
        if jax.process_count() == 1:
            raise
        print(f"error: {runtime.lost_peer_message(error)}", file=sys.stderr, flush=True)
        # At interpreter exit JAX would wait out the shutdown barrier for the dead peer, then
        # abort with pages of C++ logs: summary.json already says `failed`, so leave now.
        os._exit(1)
    print(result_line(summary, _WORKDIR.value, before), flush=True)
    return EXIT_CODES[summary["status"]]


def result_line(summary: dict, workdir: str, before: dict | None = None) -> str:
    """The run's closing line: its status, steps and final validation bits per byte to 4
    significant digits; "already finished" when `summary` is the `before` training's (a rerun
    of a finished run, which trains nothing)."""
    bpb = summary.get("final_val_bpb")
    final = f"final val {bpb:.4g} bits per byte" if isinstance(bpb, (int, float)) else (
        "no final validation")
    line = f"{summary['status']}: {workdir} after {summary['steps_completed']} steps, {final}"
    if before is not None and before.get("status") in FINISHED and summary == {
            **summary, **before}:
        return (f"already finished, nothing trained ({line}); --extend with a larger "
                "train.steps continues it")
    return line


def _run_probe(module, config) -> int:
    """Probes (no training) validate their own config: a ValueError is bad input."""
    try:
        module.run(config, _WORKDIR.value)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


# The parser every command shares (`command_line`), under the name tests and tools call here.
parse_flags = command_line.parse_flags


if __name__ == "__main__":
    command_line.start(main)
