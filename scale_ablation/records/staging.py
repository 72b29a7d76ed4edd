"""A folder written whole or not at all: built in a staging folder beside its destination, then
swapped in by one rename.

A command killed while it writes (a report, a publish) leaves the old folder as it was, never
new files beside stale ones; a build that fails (bad input found half way) leaves it too. The
swap is Linux's `renameat2(RENAME_EXCHANGE)`: one atomic step that puts the new folder at the
destination and the old one where the new one was, to be deleted. Where that call is missing,
two renames, with the old folder restored on the next run if a kill came between them.

Staging folders are named `.NAME-PREFIX-PID-RANDOM` beside the destination; those of processes
no longer alive (a kill, a crash, a full disk) are removed when the next one starts.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import pathlib
import shutil
import tempfile
from collections.abc import Iterator

_AT_FDCWD, _RENAME_EXCHANGE = -100, 2
OLD = "old"  # the fallback's name part for the old folder between its two renames


def _exchange(a: str, b: str) -> bool:
    """Swap two paths atomically; False where the kernel, C library or filesystem cannot."""
    try:
        rename = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    if rename(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), a, None, b)


def swap_in(new: str | os.PathLike, dest: str | os.PathLike) -> None:
    """Put the folder `new` at `dest` (beside it, on one filesystem); the old `dest`, if any, is
    deleted once the new one is in place."""
    new, dest = os.fspath(new), os.fspath(dest)
    if not os.path.lexists(dest):
        os.rename(new, dest)
        return
    if _exchange(new, dest):
        shutil.rmtree(new)  # the old folder, now at the staging path
        return
    parent, name = os.path.split(dest)
    old = os.path.join(parent, f".{name}-{OLD}-{os.getpid()}")
    os.rename(dest, old)
    os.rename(new, dest)
    shutil.rmtree(old)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_leftovers(dest: str | os.PathLike, prefix: str) -> list[pathlib.Path]:
    """Delete the staging folders (`.NAME-PREFIX-PID-*`) of dead processes beside `dest`, and
    those of earlier versions (`.NAME-PREFIX-RANDOM`, `.NAME-RANDOM`: no process id), and put
    back an old folder a fallback swap left between its two renames; return what was removed."""
    dest = pathlib.Path(dest)
    removed = []
    for path in sorted(dest.parent.glob(f".{dest.name}-*")):
        parts = path.name.removeprefix(f".{dest.name}-").split("-")
        if not path.is_dir() or not _leftover(parts, prefix):
            continue
        if parts[0] == OLD and not dest.exists():
            path.rename(dest)  # the kill came between the two renames: the old one is whole
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _leftover(parts: list[str], prefix: str) -> bool:
    """Whether a staging folder's name parts after `.NAME-` are of a process no longer alive."""
    if len(parts) >= 2 and parts[0] in (prefix, OLD) and parts[1].isdigit():
        return not _alive(int(parts[1]))
    # Earlier versions named them `.NAME-PREFIX-RANDOM` or `.NAME-RANDOM` (tempfile's eight
    # characters), without the process id.
    legacy = len(parts) == 1 or (len(parts) == 2 and parts[0] == prefix)
    return legacy and len(parts[-1]) == 8


@contextlib.contextmanager
def staged(dest: str | os.PathLike, prefix: str = "staging") -> Iterator[str]:
    """A fresh staging folder beside `dest` to build the new folder in; swapped in at `dest`
    when the block ends without an exception, deleted (and `dest` untouched) when it raises."""
    dest = pathlib.Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    remove_leftovers(dest, prefix)
    path = tempfile.mkdtemp(prefix=f".{dest.name}-{prefix}-{os.getpid()}-", dir=dest.parent)
    try:
        yield path
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    swap_in(path, dest)



def copy_into(old: str | os.PathLike, new: str | os.PathLike, names: tuple[str, ...]) -> None:
    """Copy `names` (files or folders) from the folder `old` into `new`: what the new folder
    keeps of the old one, which stays whole until the swap (copies, not links: the new
    folder's writer may append to what it keeps)."""
    for name in names:
        source, target = os.path.join(old, name), os.path.join(new, name)
        if os.path.isdir(source):
            shutil.copytree(source, target, symlinks=True)
        elif os.path.isfile(source):
            shutil.copy2(source, target)
