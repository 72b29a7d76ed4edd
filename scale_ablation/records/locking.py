"""One writer per directory: an OS-level lock on a run or sweep directory.

`flock` on `DIR/.lock`: the kernel releases it when its holder exits, however it exits, so a
SIGKILL leaves no stale lock to clean up. The file names the holder (PID and host) for the
message a second writer gets.

Within one process a held lock is re-entrant: a sweep holds the run directories it owns for its
whole length, and the runs it trains in-process take the same locks again. (flock itself would
refuse a second open of the file by the same process.)
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from collections.abc import Iterator, Sequence

from scale_ablation.errors import ConfigError

LOCK_NAME = ".lock"
# The locks this process holds, by real path: what the kernel already knows (the flocks), kept
# so that a second acquire in this process re-enters instead of refusing itself.
_HELD: dict[str, DirectoryLock] = {}


class DirectoryBusyError(ConfigError):
    """Another process holds the directory's lock."""


class DirectoryLock:
    """The held lock of one directory; `release` (or the process's death) frees it."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = os.fspath(directory)
        self.path = os.path.join(self.directory, LOCK_NAME)
        self._fd: int | None = None
        self._created_directory = False
        self._outer: DirectoryLock | None = None  # the lock this one re-entered

    def acquire(self) -> DirectoryLock:
        """Take the lock (creating the directory if missing); raise DirectoryBusyError naming the
        holder, having changed nothing, if another process has it."""
        if os.path.exists(self.directory) and not os.path.isdir(self.directory):
            raise ConfigError(f"{self.directory} is a file, not a directory")
        outer = _HELD.get(os.path.realpath(self.directory))
        if outer is not None:  # released by its first holder, not by this re-entry
            self._outer = outer
            return self
        self._created_directory = not os.path.exists(self.directory)
        os.makedirs(self.directory, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise DirectoryBusyError(f"{self.directory} is in use by {holder} (lock {self.path}); "
                                "wait for it to end or stop it") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"PID {os.getpid()} on host {socket.gethostname()}\n".encode(), 0)
        self._fd = fd
        _HELD[os.path.realpath(self.directory)] = self
        return self

    def release(self, *, remove_created: bool = False) -> None:
        """Free the lock. `remove_created`: also remove the directory if `acquire` created it
        and nothing else was written there (a run refused after the lock was taken)."""
        if self._outer is not None:
            self._outer = None
            return
        if self._fd is None:
            return
        _HELD.pop(os.path.realpath(self.directory), None)
        os.close(self._fd)
        self._fd = None
        if remove_created and self._created_directory:
            with contextlib.suppress(OSError):
                if os.listdir(self.directory) == [LOCK_NAME]:
                    os.remove(self.path)
                    os.rmdir(self.directory)


def holder(directory: str | os.PathLike) -> str | None:
    """Who holds `directory`'s lock when another process does (its PID and host), else None.
    Takes the lock for an instant only when no one holds it, and creates nothing."""
    if os.path.realpath(directory) in _HELD:  # this process: its own writes are no hazard
        return None
    try:
        fd = os.open(os.path.join(os.fspath(directory), LOCK_NAME), os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


@contextlib.contextmanager
def locked(directories: Sequence[str | os.PathLike]) -> Iterator[list[DirectoryLock]]:
    """Hold the locks of `directories` (all or none) for the block. A block that raises
    removes the directories it created and left empty."""
    held: list[DirectoryLock] = []
    try:
        for directory in directories:
            held.append(DirectoryLock(directory).acquire())
        yield held
    except BaseException:
        for lock in held:
            lock.release(remove_created=True)
        held.clear()
        raise
    finally:
        for lock in held:
            lock.release()
