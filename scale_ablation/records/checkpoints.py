"""Orbax checkpoints of the whole train state: save periodically, restore the newest intact one.

Every saved step gets `DIGEST_NAME`, the SHA-256 of each of its files, written after orbax has
finished the step. Orbax/TensorStore offer no such check over a whole step (zarr3's crc32c
covers only a shard's index, not the array data or orbax's metadata files), so a flipped bit in
the data would otherwise be restored silently. A step that fails its digest, or cannot be read,
is moved aside (`damaged_checkpoints/`) with a one-line warning and the next older step is used.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import traceback
from typing import Any

import jax
import orbax.checkpoint as ocp

from scale_ablation.records import jsonfiles

DIGEST_NAME = "sha256sums.json"


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


class Checkpoints:
    """`workdir/checkpoints/<step>/`, the newest `keep` of them.

    Saving is synchronous: a run killed right after `save` returns must find the checkpoint
    complete, and on the small models here a save takes a fraction of a second.
    """

    def __init__(self, workdir: str | os.PathLike, *, keep: int = 2):
        self.directory = os.path.join(os.fspath(workdir), "checkpoints")
        self._keep = keep
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
        manager.save(step, args=ocp.args.StandardSave(state))
        manager.wait_until_finished()
        self._write_digest(step)

    def step_directory(self, step: int) -> str:
        return os.path.join(self.directory, str(step))

    def _write_digest(self, step: int) -> None:
        if jax.process_index() != 0:
            return
        directory = self.step_directory(step)
        jsonfiles.write_json_atomic(os.path.join(directory, DIGEST_NAME), file_digests(directory))

    def damage(self, step: int) -> str | None:
        """Why the saved `step` does not match its digest, or None if it does. A step saved
        without a digest (killed between orbax's save and the digest) is left to the restore."""
        directory = self.step_directory(step)
        try:
            with open(os.path.join(directory, DIGEST_NAME), encoding="utf-8") as f:
                recorded = json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as error:
            return f"unreadable {DIGEST_NAME}: {error}"
        actual = file_digests(directory)
        for name, digest in sorted(recorded.items()):
            if name not in actual:
                return f"{name} is missing"
            if actual[name] != digest:
                return f"{name} does not match its recorded SHA-256"
        return None

    def restore_newest_intact(self, like: Any) -> tuple[int | None, Any]:
        """(step, state) of the newest step that passes its digest and restores; (None, like)
        when there is no checkpoint. Damaged newer steps are moved aside, each with one
        warning line. Raises CheckpointError, having moved nothing, when no step is intact."""
        steps = sorted(self._open().all_steps(), reverse=True) if os.path.isdir(
            self.directory) else []
        damaged: list[tuple[int, str]] = []
        for step in steps:
            reason = self.damage(step)
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

    def check_some_intact(self, steps: list[int]) -> None:
        """Raise CheckpointError unless one of `steps` passes its digest (reads only)."""
        newest_damage = None
        for step in sorted(steps, reverse=True):
            reason = self.damage(step)
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
            print(f"warning: checkpoint step {step} is damaged ({reason}); moved to {target}, "
                  f"resuming from step {intact}", file=sys.stderr, flush=True)
        self.close()  # the manager caches the step list

    def close(self) -> None:
        if self._manager is not None:
            self._manager.close()
            self._manager = None
