"""Run many command invocations from one Python process: `python tests/command_forks.py` reads
a JSON list of [module, args, cwd] from stdin and prints a JSON list of
{"code", "stdout", "stderr"}.

Each invocation is `python -m scale_ablation.MODULE ARGS` as the shell runs it (module run as
`__main__`, its flags defined afresh), but in a child forked from a parent that has already
imported JAX and the package's libraries: a bad invocation costs a fraction of a second rather
than the seconds of a fresh interpreter's imports. The command modules themselves are never
imported in the parent, so that each child defines their flags once.
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import runpy
import sys
import tempfile

LIBRARY_LAYERS = ("errors", "data", "model", "records", "analysis", "training", "sweeping")


def preload() -> None:
    """Import every library module (not the commands, which define flags) and the
    experiments package."""
    import scale_ablation

    for layer in LIBRARY_LAYERS:
        module = importlib.import_module(f"scale_ablation.{layer}")
        for info in pkgutil.walk_packages(getattr(module, "__path__", []), f"{module.__name__}."):
            try:
                importlib.import_module(info.name)
            except ImportError:  # an optional extra not installed: the child imports it or not
                continue
    del scale_ablation


def run_one(module: str, args: list[str], cwd: str) -> dict:
    with tempfile.TemporaryDirectory() as capture:
        out, err = os.path.join(capture, "out"), os.path.join(capture, "err")
        pid = os.fork()
        if pid == 0:  # the child: the command, its output to files, its exit status out
            code = 0
            try:
                os.chdir(cwd)
                for fd, path in ((1, out), (2, err)):
                    os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT), fd)
                sys.argv = [f"scale_ablation.{module}", *args]
                sys.path[0] = cwd  # as `python -m` puts the working directory first
                runpy.run_module(f"scale_ablation.{module}", run_name="__main__", alter_sys=True)
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int) else (
                    0 if exit_.code is None else 1)
                if not isinstance(exit_.code, (int, type(None))):
                    print(exit_.code, file=sys.stderr)
            except BaseException:  # reported as the shell would see it
                import traceback

                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        with open(out) as f_out, open(err) as f_err:
            return {"code": os.waitstatus_to_exitcode(status), "stdout": f_out.read(),
                    "stderr": f_err.read()}


def main() -> None:
    invocations = json.load(sys.stdin)
    preload()
    results = [run_one(module, args, cwd) for module, args, cwd in invocations]
    sys.stdout.write(json.dumps(results))


if __name__ == "__main__":
    main()
