"""Orbax checkpoints of the whole train state: save periodically, restore the newest intact one.

Every saved step gets `DIGEST_NAME`, the SHA-256 of each of its files, written after orbax has
finished the step. Orbax/TensorStore offer no such check over a whole step (zarr3's crc32c
covers only a shard's index, not the array data or orbax's metadata files), so a flipped bit in
the data would otherwise be restored silently. A step that fails its digest, or cannot be read,
is moved aside (`damaged_checkpoints/`) with a one-line warning and the next older step is used.
A step without its digest file (killed between orbax's save and the digest, or the file removed)
cannot be verified, and is treated the same way: never restored unverified.

Each step also records `ROWS_NAME`, how many metrics.jsonl rows were logged through it (written
before the digest, so covered by it). A step whose rows are no longer all intact (a torn or
damaged line, or rows cut away) is not resumed from: resuming there would leave a gap in the
run's history. It is moved aside like a damaged one, and the rows are recomputed from an older
step (`rows_damage`).
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import shutil
import sys
import traceback
import warnings
from collections.abc import Callable
from typing import Any

import jax
import orbax.checkpoint as ocp

from scale_ablation.records import jsonfiles
from scale_ablation.records.run_files import FINISHED, MetricsScan

DIGEST_NAME = "sha256sums.json"
ROWS_NAME = "metrics_rows.json"


class CheckpointError(ValueError):
    """A checkpoint that exists but cannot be read back."""


def file_digests(directory: str) -> dict[str, str]:
    """SHA-256 of every file under `directory` but the digest file, by relative path."""
    digests = {}
    for root, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            relative = os.path.relpath(path, directory)
            if relative == DIGEST_NAME:
                continue
            sha = hashlib.sha256()
            with open(path, "rb") as f:
                for block in iter(lambda f=f: f.read(1 << 20), b""):
                    sha.update(block)
            digests[relative] = sha.hexdigest()
    return digests


def _drop_closed_loop_callbacks(unraisable) -> None:
    """sys.unraisablehook that drops the leftovers of a failed restore.

    When one read of a damaged checkpoint fails, orbax closes its asyncio loop while other
    tensorstore reads are still in flight; as each finishes it reports either "Event loop is
    closed" or its own read error from a coroutine nobody awaits any more. They say nothing
    beyond the restore's error, which is reported once.
    """
    error = unraisable.exc_value
    if isinstance(error, RuntimeError) and str(error) == "Event loop is closed":
        return
    code = getattr(unraisable.object, "cr_code", None)
    frames = traceback.extract_tb(unraisable.exc_traceback) if unraisable.exc_traceback else []
    filenames = [code.co_filename] if code else []
    filenames += [frame.filename for frame in frames]
    if any(f"{os.sep}orbax{os.sep}" in name for name in filenames):
        return
    sys.__unraisablehook__(unraisable)


def quiet_failed_restores() -> None:
    """Keep the leftovers of a failed restore off stderr: its one-line error says it all.
    Process-wide (sys.unraisablehook, asyncio's logger): entry points call it, once."""
    sys.unraisablehook = _drop_closed_loop_callbacks
    # The failed reads' never-retrieved futures are logged by asyncio when collected.
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    quiet_full_disk()


def _not_a_full_disk_log(record: logging.LogRecord) -> bool:
    """logging filter: False for orbax's own log lines of a write that hit a full disk (each
    of its writer threads logs the error with a traceback; `save` reports it once)."""
    if f"{os.sep}orbax{os.sep}" not in record.pathname:
        return True
    text = record.getMessage()
    return "RESOURCE_EXHAUSTED" not in text and "No space left on device" not in text


def quiet_full_disk() -> None:
    """Keep the echoes of a full disk off stderr, where one line reports it: orbax's threads'
    logged tracebacks, and JAX's warning per compiled program that its persistent cache entry
    could not be written (the cache is an optimisation). Process-wide: entry points only."""
    logging.getLogger("absl").addFilter(_not_a_full_disk_log)
    warnings.filterwarnings("ignore", message=r"Error writing persistent compilation cache "
                            r"entry.*(No space left on device|Errno 28)", category=UserWarning)


class Checkpoints:
    """`workdir/checkpoints/<step>/`, the newest `keep` of them.

    Saving is synchronous: a run killed right after `save` returns must find the checkpoint
    complete, and on the small models here a save takes a fraction of a second.
    """

    def __init__(self, workdir: str | os.PathLike, *, keep: int = 2,
                 rows_through: Callable[[int], int] | None = None):
        """`rows_through(step)`: how many metrics rows the run has logged through `step`,
        recorded with each save (`ROWS_NAME`); None records nothing."""
        self.directory = os.path.join(os.fspath(workdir), "checkpoints")
        self._keep = keep
        self._rows_through = rows_through
        self._manager: ocp.CheckpointManager | None = None

    def _open(self) -> ocp.CheckpointManager:
        if self._manager is None:
            self._manager = ocp.CheckpointManager(
                os.path.abspath(self.directory),
                options=ocp.CheckpointManagerOptions(
                    max_to_keep=self._keep, create=True, enable_async_checkpointing=False
                ),
            )
        return self._manager

    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step, without creating anything on disk."""
        if not os.path.isdir(self.directory):
            return None
        return self._open().latest_step()

    def restore(self, step: int, like: Any) -> Any:
        """The state saved at `step`, shaped and sharded like the pytree `like`."""
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
        try:
            return self._open().restore(step, args=ocp.args.StandardRestore(abstract))
        except Exception as error:  # orbax raises many types for a damaged or foreign checkpoint
            first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
            if len(first_line) > 200:  # cut at a word, and say so
                first_line = first_line[:200].rsplit(" ", 1)[0] + " ..."
            raise CheckpointError(
                f"cannot read checkpoint {self.directory}/{step}: {type(error).__name__}: "
                f"{first_line}"
            ) from error

    def save(self, step: int, state: Any) -> None:
        manager = self._open()
        if step in manager.all_steps():
            return
        try:
            manager.save(step, args=ocp.args.StandardSave(state))
            manager.wait_until_finished()
        except ValueError as error:
            full_disk = _as_full_disk(error, self.step_directory(step))
            if full_disk is None:
                raise
            raise full_disk from error
        self._write_digest(step)

    def step_directory(self, step: int) -> str:
        return os.path.join(self.directory, str(step))

    def drop_older_when_finished(self, status: str, checkpoint_config, label: str) -> None:
        """A finished run keeps only its final checkpoint unless `checkpoint.keep_finished`:
        the older ones are there to resume an interrupted run, and in a sweep they were most of
        its disk. The loop calls it before summary.json, so that a kill in between leaves an
        unfinished run whose rerun resumes from that final checkpoint and drops the rest again."""
        if status not in FINISHED or checkpoint_config.get("keep_finished", False):
            return
        try:
            self.keep_newest_only()
        except OSError as error:  # a leftover costs disk, not the run's result
            print(f"{label}warning: older checkpoints not removed: {error}", flush=True)

    def remove_when_finished(self, status: str, checkpoint_config, label: str) -> None:
        """A completed run of a smoke sweep (`checkpoint.keep_final` off) keeps no checkpoint,
        so it cannot be extended (`run_setup.check_before_start` refuses); a diverged one keeps
        the step `nonfinite` replays from. The loop calls it after summary.json: a kill before
        it leaves a finished run with its checkpoints (disk, not results)."""
        if (status != "completed" or checkpoint_config.get("keep_final", True)
                or jax.process_index() != 0):
            return
        try:
            shutil.rmtree(self.directory, ignore_errors=False)
        except FileNotFoundError:
            pass
        except OSError as error:  # a leftover costs disk, not the run's result
            print(f"{label}warning: checkpoints not removed: {error}", flush=True)

    def keep_newest_only(self) -> int | None:
        """Delete every saved step but the newest; return the newest (None: none saved).

        For a finished run (`checkpoint.keep_finished` off): its newest step is its final state,
        all that `--extend` resumes from and `nonfinite` replays from; the older ones only held
        a run that might still be interrupted. Damaged steps moved aside stay where they are."""
        manager = self._open()
        saved = sorted(manager.all_steps())
        for step in saved[:-1]:
            manager.delete(step)
        return saved[-1] if saved else None

    def _write_digest(self, step: int) -> None:
        if jax.process_index() != 0:
            return
        directory = self.step_directory(step)
        if self._rows_through is not None:
            jsonfiles.write_json_atomic(os.path.join(directory, ROWS_NAME),
                                        {"rows_through_step": self._rows_through(step)})
        jsonfiles.write_json_atomic(os.path.join(directory, DIGEST_NAME), file_digests(directory))

    def damage(self, step: int) -> str | None:
        """Why the saved `step` does not match its digest, or None if it does. A step
        without a digest (killed between orbax's save and the digest, or the file removed)
        cannot be verified: that is its damage."""
        directory = self.step_directory(step)
        try:
            with open(os.path.join(directory, DIGEST_NAME), encoding="utf-8") as f:
                recorded = json.load(f)
        except FileNotFoundError:
            return f"no {DIGEST_NAME}, so it cannot be verified"
        except (OSError, ValueError) as error:
            return f"unreadable {DIGEST_NAME}: {error}"
        actual = file_digests(directory)
        for name, digest in sorted(recorded.items()):
            if name not in actual:
                return f"{name} is missing"
            if actual[name] != digest:
                return f"{name} does not match its recorded SHA-256"
        return None

    def rows_damage(self, step: int, scan: MetricsScan) -> str | None:
        """Why the metrics rows through `step` are not all intact in `scan`, or None.

        With the row count the step recorded (`ROWS_NAME`) the rule is exact: the intact rows
        must hold that many through `step`. A step saved before the count existed is trusted
        when no line is damaged, and otherwise only if it is before the last intact row.
        """
        try:
            with open(os.path.join(self.step_directory(step), ROWS_NAME), encoding="utf-8") as f:
                recorded = json.load(f)["rows_through_step"]
        except FileNotFoundError:
            recorded = None
        except (OSError, ValueError, KeyError, TypeError) as error:
            return f"unreadable {ROWS_NAME}: {error}"
        have = scan.count_through(step)
        if recorded is not None:
            if have >= recorded:
                return None
            lost = scan.damage or f"{recorded - have} of them are missing"
            return (f"{recorded} metrics rows through step {step} were logged, {have} are "
                    f"intact ({lost})")
        if scan.damage is None or (scan.last_step is not None and step < scan.last_step):
            return None
        return f"its metrics rows are not all intact ({scan.damage})"

    def _reason(self, step: int, scan: MetricsScan | None) -> str | None:
        reason = self.damage(step)
        if reason is None and scan is not None:
            rows = self.rows_damage(step, scan)
            reason = None if rows is None else f"{ROWS_REASON}: {rows}"
        return reason

    def restore_newest_intact(self, like: Any, scan: MetricsScan | None = None
                              ) -> tuple[int | None, Any]:
        """(step, state) of the newest step that passes its digest (and, given the run's
        `scan` of metrics.jsonl, whose rows are intact) and restores; (None, like) when there
        is no checkpoint. Newer steps are moved aside, each with one warning line. Raises
        CheckpointError, having moved nothing, when no step is usable."""
        steps = sorted(self._open().all_steps(), reverse=True) if os.path.isdir(
            self.directory) else []
        damaged: list[tuple[int, str]] = []
        for step in steps:
            reason = self._reason(step, scan)
            if reason is None:
                try:
                    state = self.restore(step, like)
                except CheckpointError as error:
                    reason = str(error)
                else:
                    self._move_aside(damaged, step)
                    return step, state
            damaged.append((step, reason))
        if not damaged:
            return None, like
        raise self._none_intact(*damaged[0])

    def check_some_intact(self, steps: list[int], scan: MetricsScan | None = None) -> None:
        """Raise CheckpointError unless one of `steps` passes its digest (and has intact rows
        in `scan`, if given); reads only."""
        newest_damage = None
        for step in sorted(steps, reverse=True):
            reason = self._reason(step, scan)
            if reason is None:
                return
            newest_damage = newest_damage or (step, reason)
        if newest_damage is not None:
            raise self._none_intact(*newest_damage)

    def _none_intact(self, step: int, reason: str) -> CheckpointError:
        return CheckpointError(
            f"no intact checkpoint in {self.directory} (newest, step {step}: {reason}); move "
            f"{self.directory} aside to restart from step 0, or use a new --workdir")

    def _move_aside(self, damaged: list[tuple[int, str]], intact: int) -> None:
        if not damaged:
            return
        aside = os.path.join(os.path.dirname(self.directory), "damaged_checkpoints")
        os.makedirs(aside, exist_ok=True)
        for step, reason in damaged:
            target = os.path.join(aside, str(step))
            suffix = 1
            while os.path.exists(target):
                target, suffix = os.path.join(aside, f"{step}.{suffix}"), suffix + 1
            os.replace(self.step_directory(step), target)
            if reason.startswith(ROWS_REASON):
                print(f"warning: checkpoint step {step} is not resumed from ({reason}); moved "
                      f"to {target}, resuming from step {intact} (steps {intact + 1}-{step} are "
                      "recomputed)", file=sys.stderr, flush=True)
            else:
                print(f"warning: checkpoint step {step} is damaged ({reason}); moved to "
                      f"{target}, resuming from step {intact}", file=sys.stderr, flush=True)
        self.close()  # the manager caches the step list

    def close(self) -> None:
        if self._manager is not None:
            self._manager.close()
            self._manager = None


ROWS_REASON = "its metrics rows are lost"


def _as_full_disk(error: ValueError, directory: str) -> OSError | None:
    """Orbax reports a full disk inside a save as `ValueError: RESOURCE_EXHAUSTED: ... No space
    left on device` (TensorStore's status); as an OSError(ENOSPC) it is the full disk that every
    caller already turns into one line. None for any other error."""
    text = str(error)
    if "RESOURCE_EXHAUSTED" in text or "No space left on device" in text:
        return OSError(errno.ENOSPC, "No space left on device", directory)
    return None
