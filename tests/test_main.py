"""The command line on bad input: exit code 2, one readable `error:` line, the workdir untouched.

Each case runs `python -m scale_ablation.main` against a copy of a resumable run directory (a
finished run without its summary.json), so a command that got past validation would resume,
and write, there.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest
from helpers import snapshot

from scale_ablation.training import experiment_files as experiment
from scale_ablation.training import train

REPO = pathlib.Path(__file__).resolve().parents[1]
BASE = str(REPO / "experiments" / "base.py")
QUICK = BASE + ":quick"
OFFLINE_ENV = {"WANDB_MODE": "offline", "WANDB_SILENT": "true"}
TINY = {
    "model.d_model": 32,
    "model.num_layers": 1,
    "model.num_heads": 2,
    "model.head_dim": 16,
    "data.seq_len": 32,
    "data.val_batches": 1,
    "train.batch_size": 4,
    "train.steps": 10,
    "train.log_every": 5,
    "train.eval_every": 5,
    "train.diag_every": 0,
    "checkpoint.every": 5,
    "wandb.mode": "disabled",
}
# absl log lines (WARNING:absl:..., W0101 12:00:00.0 ..., I0101 ...) are not the error report.
ABSL_LOG = re.compile(r"^(WARNING|[WI]\d{4} )")




@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A finished TINY run (checkpoints at 5 and 10, both kept: `resumable` is a copy of it
    killed before its summary, which still had them), made in-process."""
    workdir = tmp_path_factory.mktemp("finished") / "run"
    config = experiment.apply_overrides(experiment.load_config(QUICK),
                                        {**TINY, "checkpoint.keep_finished": True})
    with pytest.MonkeyPatch.context() as env:
        for name, value in OFFLINE_ENV.items():
            env.setenv(name, value)
        assert train.train(config, workdir)["status"] == "completed"
    return workdir


@pytest.fixture
def resumable(finished_run, tmp_path):
    workdir = tmp_path / "run"
    shutil.copytree(finished_run, workdir)
    (workdir / "summary.json").unlink()
    return workdir


def run_main(workdir, overrides=None, *, config=QUICK, extra_flags=(), env=None):
    command = [
        sys.executable,
        "-m",
        "scale_ablation.main",
        f"--config={config}",
        f"--workdir={workdir}",
        *experiment.override_flags({**TINY, **(overrides or {})}),
        *extra_flags,
    ]
    return subprocess.run(
        command,
        cwd=REPO,
        env={**os.environ, **OFFLINE_ENV, **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )


def error_lines(result, *, also_ignore=None) -> list[str]:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    lines = [line for line in lines if not ABSL_LOG.match(line)]
    if also_ignore is not None:
        lines = [line for line in lines if not also_ignore.match(line)]
    return lines


def assert_one_error_line(result, *expected: str, also_ignore=None) -> str:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = error_lines(result, also_ignore=also_ignore)
    assert len(lines) == 1, result.stderr
    (line,) = lines
    assert line.startswith("error: ")
    for text in expected:
        assert text in line, line
    return line


BAD_OVERRIDES = {
    "unknown policy": ({"policy": "nosuch"}, ["policy", "nosuch"]),
    "unknown data source": ({"data.source": "nosuch"}, ["data.source", "nosuch"]),
    "missing corpus": ({"data.source": "text:/nonexistent/corpus"}, ["/nonexistent/corpus"]),
    "zero head_dim": ({"model.head_dim": 0}, ["model.head_dim"]),
    "seq_len over max_seq_len": ({"data.seq_len": 2048}, ["data.seq_len", "max_seq_len"]),
    "zero learning rate": ({"train.lr": 0.0}, ["train.lr"]),
    "nan learning rate": ({"train.lr": "nan"}, ["train.lr"]),
    "zero scale LR multiplier": ({"train.scale_lr_multiplier": 0.0},
                                 ["train.scale_lr_multiplier", "positive"]),
}


@pytest.mark.parametrize("case", list(BAD_OVERRIDES))
def test_bad_config_value(case, resumable):
    overrides, expected = BAD_OVERRIDES[case]
    before = snapshot(resumable)
    assert_one_error_line(run_main(resumable, overrides), *expected)
    assert snapshot(resumable) == before


@pytest.mark.parametrize(
    "config,extra_flags,expected",
    [
        (QUICK, ["--config.model.head_dimm=8"], ["--config.model.head_dimm", "head_dim"]),
        (QUICK, ["--config.nosuch.field=1"], ["--config.nosuch.field", "nosuch"]),
        (QUICK, ["--config.train.lr=fast"], ["--config.train.lr", "fast"]),
        (BASE + ":nosuch", [], ["unknown variant", "nosuch"]),
        (str(REPO / "experiments" / "nosuch.py"), [], ["nosuch.py"]),
    ],
    ids=["misspelt field", "unknown section", "non-number", "unknown variant", "missing file"],
)
def test_bad_command_line(config, extra_flags, expected, resumable):
    before = snapshot(resumable)
    result = run_main(resumable, config=config, extra_flags=extra_flags)
    assert_one_error_line(result, *expected)
    assert snapshot(resumable) == before


def test_bad_input_creates_no_workdir(tmp_path):
    workdir = tmp_path / "new"
    assert_one_error_line(run_main(workdir, {"train.lr": -1.0}), "train.lr")
    assert not workdir.exists()


def test_batch_size_must_divide_across_devices(resumable):
    before = snapshot(resumable)
    result = run_main(
        resumable,
        {"train.batch_size": 4},
        env={"XLA_FLAGS": "--xla_force_host_platform_device_count=8"},
    )
    assert_one_error_line(result, "train.batch_size", "8 devices")
    assert snapshot(resumable) == before


# orbax logs, at ERROR, the file it failed to parse before raising; that log line may stay.
ORBAX_ERROR_LOG = re.compile(r"^E\d{4} .*\] Failed to")
CORRUPTIONS = {
    "every file": "**/*",
    "array data": "default/ocdbt.process_0/d/*",
    "manifest": "default/manifest.ocdbt",
}


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_truncated_checkpoint(corruption, resumable):
    """Every checkpoint damaged: refused, naming the newest. (One damaged, the run falls back
    to the previous one: tests/test_train_faults.py.)"""
    for step in (5, 10):
        checkpoint = resumable / "checkpoints" / str(step)
        damaged = [path for path in checkpoint.glob(CORRUPTIONS[corruption]) if path.is_file()]
        assert damaged
        for path in damaged:
            os.truncate(path, path.stat().st_size // 2)
    before = snapshot(resumable)
    result = run_main(resumable)
    assert_one_error_line(
        result, f"no intact checkpoint in {resumable / 'checkpoints'} (newest, step 10",
        also_ignore=ORBAX_ERROR_LOG
    )
    assert snapshot(resumable) == before
