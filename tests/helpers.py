"""Small helpers shared by the tests: a tiny run config, and looking at run directories."""

import hashlib
import importlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap
from types import ModuleType

import filelock
import pytest

from scale_ablation.training import experiment_files as experiment
from scale_ablation.training import runtime

REPO = pathlib.Path(__file__).resolve().parents[1]
QUICK = str(REPO / "experiments" / "base.py") + ":quick"
# Ten steps of a model that compiles in about a second: logs at 2, 4, ..., evaluates and
# checkpoints at 5 and 10; no diagnostics, no W&B.
TINY_MODEL = {  # and its batches: what the tiny runs and sweeps of the tests share
    "model.d_model": 32, "model.num_layers": 1, "model.num_heads": 2, "model.head_dim": 16,
    "data.seq_len": 32, "data.val_batches": 1, "train.batch_size": 4,
}
# An environment entry that takes the suite's shared XLA cache (conftest.py) away from a command:
# its cache is then the one beside its workdir, so a check that nothing was created there holds
# that cache too.
OWN_CACHE = {runtime.CACHE_VARIABLE: ""}
TINY_RUN = {
    **TINY_MODEL, "train.steps": 10, "train.log_every": 2, "train.eval_every": 5,
    "train.diag_every": 0, "checkpoint.every": 5, "wandb.mode": "disabled",
}


# The oracles: packages that only the tests use, as independent references to compare against,
# and the extra that installs each (pyproject.toml).
ORACLE_EXTRAS = {"torch": "reference", "mup": "mup", "unit_scaling": "mup",
                 "wandb_workspaces": "workspace", "scipy": "test"}


def require(module: str) -> ModuleType:
    """Import the oracle `module` for a test that compares against it. Without it the test skips
    on a contributor's machine and fails under CI (`CI=true`): a check against an independent
    implementation that silently skips is the one that would have caught a wrong result."""
    hint = f"pip install -e '.[{ORACLE_EXTRAS[module.split('.')[0]]}]'"
    if os.environ.get("CI", "").lower() not in ("true", "1"):
        return pytest.importorskip(module, reason=f"the oracle {module} is missing: {hint}")
    try:
        return importlib.import_module(module)
    except ImportError as error:
        pytest.fail(f"CI=true and the oracle {module} is missing ({error}): {hint}",
                    pytrace=False)


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


def shared_root(tmp_path_factory) -> pathlib.Path:
    """A directory every pytest process of this run of the suite sees: the run's own temporary
    root, above each xdist worker's (pytest-xdist's recipe for session fixtures built once)."""
    root = tmp_path_factory.getbasetemp()
    return root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root


def built_once(directory: pathlib.Path, build) -> pathlib.Path:
    """`build(directory)` under a file lock, unless an earlier call finished it: the first
    process that needs a fixture builds it, the others wait for it and reuse it."""
    done = directory / ".built"
    with filelock.FileLock(f"{directory}.lock"):
        if not done.exists():
            shutil.rmtree(directory, ignore_errors=True)  # what a failed build left
            build(directory)
            done.touch()
    return directory


def read_json(path) -> dict:
    return json.loads(pathlib.Path(path).read_text())


def swept_runs(spec: str, workdir) -> list[tuple[dict, dict]]:
    """`scale_ablation.sweep --config=SPEC --workdir=WORKDIR` run to its report (asserted to
    succeed); (config, summary) of every run it finished, by run name."""
    result = subprocess.run([sys.executable, "-m", "scale_ablation.sweep", f"--config={spec}",
                             f"--workdir={workdir}"], capture_output=True, text=True, cwd=REPO,
                            timeout=1200)
    assert result.returncode == 0, result.stderr[-2000:]
    return [(read_json(run / "config.json"), read_json(run / "summary.json"))
            for run in sorted(pathlib.Path(workdir).iterdir())
            if (run / "summary.json").exists()]


def swept_rows(spec: str, workdir) -> list[dict]:
    """`scale_ablation.sweep` of SPEC without its report (asserted to succeed); the report's row
    of every run."""
    from scale_ablation import report

    result = subprocess.run([sys.executable, "-m", "scale_ablation.sweep", f"--config={spec}",
                             f"--workdir={workdir}", "--report=false"], capture_output=True,
                            text=True, cwd=REPO, timeout=1200)
    assert result.returncode == 0, result.stderr[-2000:]
    return [report.summarise_run(run) for run in report.load_runs(str(workdir))]


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


def copy_into_reference(model, reference) -> None:
    """scale_ablation's parameters into benchmarks/reference_gpt2.py's PyTorch model (Linear
    weight = kernel.T; the position table cut to the reference's rows). A layer without a bias
    (the `fan_in` init's attention) must have none on the PyTorch side either."""
    import numpy as np
    import torch

    def put(target, value):
        with torch.no_grad():
            target.copy_(torch.from_numpy(np.array(value)))

    put(reference.wte.weight, model.embed.embedding[...])
    put(reference.wpe.weight, model.position_embed.embedding[...][: reference.wpe.num_embeddings])
    pairs = [("q", "attention.query"), ("k", "attention.key"), ("v", "attention.value"),
             ("attn_out", "attention.out"), ("mlp_in", "mlp_in"), ("mlp_out", "mlp_out")]
    for ours, theirs in zip(model.blocks, reference.blocks, strict=True):
        for name, path in pairs:
            layer = ours
            for part in path.split("."):
                layer = getattr(layer, part)
            put(getattr(theirs, name).weight, np.asarray(layer.kernel[...]).T)
            assert (getattr(theirs, name).bias is None) == (layer.bias is None), name
            if layer.bias is not None:
                put(getattr(theirs, name).bias, layer.bias[...])
        for norm, ln in ((ours.attention_norm, theirs.ln_1), (ours.mlp_norm, theirs.ln_2)):
            put(ln.weight, norm.scale[...])
            put(ln.bias, norm.bias[...])
            ln.eps = norm.epsilon
    put(reference.ln_f.weight, model.final_norm.scale[...])
    put(reference.ln_f.bias, model.final_norm.bias[...])
    reference.ln_f.eps = model.final_norm.epsilon
