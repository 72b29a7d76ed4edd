"""Small helpers shared by the tests: a tiny run config, and looking at run directories."""

import hashlib
import json
import pathlib
import textwrap

from scale_ablation.training import experiment_files as experiment

REPO = pathlib.Path(__file__).resolve().parents[1]
QUICK = str(REPO / "experiments" / "base.py") + ":quick"
# Ten steps of a model that compiles in about a second: logs at 2, 4, ..., evaluates and
# checkpoints at 5 and 10; no diagnostics, no W&B.
TINY_MODEL = {  # and its batches: what the tiny runs and sweeps of the tests share
    "model.d_model": 32, "model.num_layers": 1, "model.num_heads": 2, "model.head_dim": 16,
    "data.seq_len": 32, "data.val_batches": 1, "train.batch_size": 4,
}
TINY_RUN = {
    **TINY_MODEL, "train.steps": 10, "train.log_every": 2, "train.eval_every": 5,
    "train.diag_every": 0, "checkpoint.every": 5, "wandb.mode": "disabled",
}


def tiny_config(**overrides):
    """The quick experiment shrunk to TINY_RUN, with `overrides` (dotted keys) on top."""
    return experiment.apply_overrides(experiment.load_config(QUICK), {**TINY_RUN, **overrides})


def experiment_source(doc: str, overrides: dict, grid: str, when_arg: str = "") -> str:
    """An experiment file for a test: the quick experiment with the dotted `overrides`, then the
    statements `when_arg` (get_config's body, which may read `arg`), and `sweep(arg)` returning
    the Python expression `grid`."""
    body = textwrap.indent(textwrap.dedent(when_arg).strip(), "    ")
    return (f'"""{doc}"""\n\nfrom experiments import base\n\n'
            "from scale_ablation.training import experiment_files as experiment\n\n\ndef get_config(arg=None):\n"
            f"    config = experiment.apply_overrides(base.get_config('quick'), {overrides!r})\n"
            + (f"{body}\n" if body else "")
            + f"    return config\n\n\ndef sweep(arg=None):\n    return {grid}\n")


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
