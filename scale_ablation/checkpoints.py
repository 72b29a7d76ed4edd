"""Orbax checkpoints of the whole train state: save periodically, restore the latest."""

from __future__ import annotations

import logging
import os
import sys
import traceback
from typing import Any

import jax
import orbax.checkpoint as ocp


class CheckpointError(ValueError):
    """A checkpoint that exists but cannot be read back."""


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
            raise CheckpointError(
                f"cannot read checkpoint {self.directory}/{step}: {type(error).__name__}: "
                f"{first_line[:200]}"
            ) from error

    def save(self, step: int, state: Any) -> None:
        manager = self._open()
        if step in manager.all_steps():
            return
        manager.save(step, args=ocp.args.StandardSave(state))
        manager.wait_until_finished()

    def close(self) -> None:
        if self._manager is not None:
            self._manager.close()
            self._manager = None
