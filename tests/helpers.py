"""Small helpers shared by the tests that look at run directories."""

import hashlib
import json
import pathlib


def read_json(path) -> dict:
    return json.loads(pathlib.Path(path).read_text())


def snapshot(directory) -> dict[str, tuple]:
    """Every file and folder under `directory`: (size, mtime_ns, sha256) for files, so that a
    test can show a command touched nothing."""
    out = {}
    for path in sorted(pathlib.Path(directory).rglob("*")):
        key = str(path.relative_to(directory))
        if path.is_file():
            stat = path.stat()
            out[key] = (stat.st_size, stat.st_mtime_ns, hashlib.sha256(path.read_bytes()).digest())
        else:
            out[key] = ("dir",)
    return out
