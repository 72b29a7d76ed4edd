"""The launchers: their dry runs print the commands a user expects, bad arguments fail in one
line, and the W&B sweep definition runs exactly the experiment's grid.

The shell scripts run under bash with fake `gcloud`, `sbatch`, `srun`, `python` and `python3`
first on PATH that record any call: a dry run must call none of them.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from scale_ablation.training import experiment_files as experiment

REPO = Path(__file__).resolve().parents[1]
LAUNCH = REPO / "launch"
FAKED = ("gcloud", "sbatch", "srun", "python", "python3")


@pytest.fixture
def env(tmp_path):
    """An environment whose faked tools append to `calls` and fail."""
    fake_bin = tmp_path / "fake_bin"
    fake_bin.mkdir()
    for tool in FAKED:
        script = fake_bin / tool
        script.write_text(f'#!/bin/sh\necho "{tool} $*" >> {tmp_path}/calls\nexit 97\n')
        script.chmod(0o755)
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TPU_"))}
    environ |= {"PATH": f"{fake_bin}:{os.environ['PATH']}", "VENV": str(tmp_path / "no_venv")}
    yield environ
    assert not (tmp_path / "calls").exists(), (tmp_path / "calls").read_text()


def bash(script: str, *args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(LAUNCH / script), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=30,
    )


def commands(stdout: str) -> list[list[str]]:
    """The printed `+ ...` lines, split as the shell would split them."""
    return [shlex.split(line[2:]) for line in stdout.splitlines() if line.startswith("+ ")]


def assert_one_line_error(result: subprocess.CompletedProcess) -> None:
    assert result.returncode != 0
    assert result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.parametrize("script", ["local.sh", "slurm.sbatch", "tpu_vm.sh"])
def test_help_prints_usage(script, env):
    for flag in ("-h", "--help"):
        result = bash(script, flag, env=env)
        assert result.returncode == 0
        assert result.stdout.startswith("usage: ")


# local.sh


def test_local_dry_run_sets_up_venv_then_sweeps_and_reports(env):
    venv = env["VENV"]
    sweep_args = ["--config=experiments/base.py:quick", "--workdir=runs/x", "--noreport",
                  "--parallel=2"]
    result = bash(
        "local.sh", "experiments/base.py:quick", "runs/x", "--dry_run", "--parallel=2", env=env
    )
    assert result.returncode == 0, result.stderr
    assert commands(result.stdout) == [
        ["python3", "-m", "venv", venv],
        [f"{venv}/bin/python", "-m", "pip", "install", "-e", "."],
        [f"{venv}/bin/python", "-m", "scale_ablation.sweep", *sweep_args],
        [f"{venv}/bin/python", "-m", "scale_ablation.report", "runs/x"],
    ]


def test_local_installs_only_when_needed(env, tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("#!/bin/sh\nexit 0\n")  # "scale_ablation is importable"
    (venv / "bin" / "python").chmod(0o755)
    env |= {"VENV": str(venv), "EXTRAS": "cuda12"}
    result = bash("local.sh", "experiments/base.py:quick", "--dry_run", "--", "--dry_run", env=env)
    assert result.returncode == 0, result.stderr
    python = f"{venv}/bin/python"
    rest = ["--workdir=runs/base_quick", "--noreport", "--dry_run"]
    assert commands(result.stdout) == [
        [python, "-m", "scale_ablation.sweep", "--config=experiments/base.py:quick", *rest],
        [python, "-m", "scale_ablation.report", "runs/base_quick"],
    ]
    stamp = venv / ".scale_ablation-installed"  # installed before pyproject.toml last changed
    stamp.touch()
    os.utime(stamp, (0, 0))
    result = bash("local.sh", "experiments/base.py", "--dry_run", env=env)
    assert commands(result.stdout)[0] == [python, "-m", "pip", "install", "-e", ".[cuda12]"]
    assert commands(result.stdout)[1][4] == "--workdir=runs/base"


def test_local_passes_imports_to_the_sweep_and_the_report(env):
    imports = "--imports=my_policy.py,my_package.policies"
    result = bash("local.sh", "experiments/base.py:quick", "runs/x", "--dry_run", imports,
                  "--add_policies=p", env=env)
    assert result.returncode == 0, result.stderr
    sweep, report = commands(result.stdout)[-2:]
    assert sweep[-2:] == [imports, "--add_policies=p"]
    assert report[-2:] == [imports, "runs/x"]


@pytest.mark.skipif(
    not (REPO / "experiments/dk_sweep.py").exists(), reason="experiments/dk_sweep.py not written"
)
def test_local_defaults_to_the_quick_dk_sweep(env):
    result = bash("local.sh", "--dry_run", env=env)
    assert result.returncode == 0, result.stderr
    sweep = commands(result.stdout)[-2]
    assert sweep[-3:] == [
        "--config=experiments/dk_sweep.py:quick", "--workdir=runs/dk_sweep_quick", "--noreport"
    ]


@pytest.mark.parametrize(
    "args", [["experiments/missing.py"], ["experiments/base.py", "runs/x", "--parallel", "2"]]
)
def test_local_bad_arguments(args, env):
    assert_one_line_error(bash("local.sh", *args, "--dry_run", env=env))


# slurm.sbatch


def sbatch_defaults() -> list[str]:
    text = (LAUNCH / "slurm.sbatch").read_text()
    return re.findall(r"^#SBATCH (--\S+)", text, flags=re.MULTILINE)


def test_slurm_headers_ask_for_one_task_per_gpu():
    options = dict(option.partition("=")[::2] for option in sbatch_defaults())
    assert options["--gpus-per-task"] == "1"
    assert {"--nodes", "--ntasks-per-node", "--time", "--output"} <= set(options)


def test_slurm_headers_ask_for_a_warning_before_the_time_limit_and_requeue():
    """USR1 to the batch shell (B:), which forwards it; the log survives the requeue."""
    options = dict(option.partition("=")[::2] for option in sbatch_defaults())
    assert re.fullmatch(r"B:USR1@\d+", options["--signal"])
    assert "--requeue" in options and options["--open-mode"] == "append"


def test_slurm_dry_run_single_run(env):
    args = ["--config=experiments/base.py:gpu", "--workdir=runs/base_gpu", "--config.policy=none"]
    result = bash("slurm.sbatch", "--dry_run", *args, env=env)
    assert result.returncode == 0, result.stderr
    submit, step = commands(result.stdout)
    assert submit == ["sbatch", *sbatch_defaults(), "launch/slurm.sbatch", *args]
    assert step == ["srun", "--kill-on-bad-exit=1", "python", "-m", "scale_ablation.main", *args]


def test_slurm_dry_run_sweep_runs_one_process_on_one_node(env):
    args = ["--config", "experiments/base.py", "--workdir=runs/base", "--parallel=4"]
    result = bash("slurm.sbatch", "sweep", "--dry_run", *args, env=env)
    assert result.returncode == 0, result.stderr
    submit, step = commands(result.stdout)
    assert "--nodes=1" in submit and "--ntasks-per-node" in " ".join(submit)
    assert submit[-len(args) - 2 :] == ["launch/slurm.sbatch", "sweep", *args]
    preallocate = "XLA_PYTHON_CLIENT_PREALLOCATE=false"
    assert step == ["env", preallocate, "python", "-m", "scale_ablation.sweep", *args]


def test_slurm_inside_a_job(env):
    """In the allocation: srun gets the job's CPUs per task; the sweep doesn't see SLURM_*."""
    env |= {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "16", "SLURM_CPUS_PER_TASK": "8"}
    env["SLURM_SUBMIT_DIR"] = str(REPO)
    args = ["--config=experiments/base.py", "--workdir=runs/b"]
    run = commands(bash("slurm.sbatch", "--dry_run", *args, env=env).stdout)
    assert run[1] == ["export", "SRUN_CPUS_PER_TASK=8"]
    assert run[2][0] == "srun"
    sweep = commands(bash("slurm.sbatch", "--dry_run", "sweep", *args, env=env).stdout)[-1]
    unset = {sweep[i + 1] for i, word in enumerate(sweep) if word == "-u"}
    assert {"SLURM_JOB_ID", "SLURM_NTASKS", "SLURM_CPUS_PER_TASK", "SLURM_SUBMIT_DIR"} <= unset
    assert sweep[-5:-2] == ["python", "-m", "scale_ablation.sweep"]


@pytest.mark.parametrize(
    "args",
    [
        ["--workdir=runs/x"],
        ["--config=experiments/base.py"],
        ["--config=experiments/base.py", "--workdir=runs/x", "stray"],
        ["--config=experiments/base.py", "sweep", "--workdir=runs/x"],
    ],
)
def test_slurm_bad_arguments(args, env):
    assert_one_line_error(bash("slurm.sbatch", "--dry_run", *args, env=env))


# tpu_vm.sh


def test_tpu_dry_run_creates_installs_runs_copies_back_and_deletes(env):
    result = bash(
        "tpu_vm.sh",
        "--dry_run",
        "--name=abl-1",
        "--zone=us-west4-a",
        "--type=v5litepod-16",
        "--config=experiments/base.py:quick",
        "--workdir=runs/tpu",
        "--delete",
        "--",
        "--config.policy=none",
        env=env,
    )
    assert result.returncode == 0, result.stderr
    create, pack, copy, install, run, mkdir, fetch, delete = commands(result.stdout)
    tpu = ["gcloud", "compute", "tpus", "tpu-vm"]
    zone = "--zone=us-west4-a"
    assert create[:7] == [*tpu, "create", "abl-1", zone]
    assert create[-2:] == ["--accelerator-type=v5litepod-16", "--version=v2-alpha-tpuv5-lite"]
    tarball = copy[5]
    assert pack[:2] == ["bash", "-c"] and f"tar -czf {tarball}" in pack[2]
    assert copy == [*tpu, "scp", tarball, "abl-1:scale_ablation.tar.gz", zone, "--worker=all"]
    assert install[:-1] == [*tpu, "ssh", "abl-1", zone, "--worker=all"]
    assert re.search(r"pip install .*-e \"\.\[tpu,hf\]\"", install[-1])
    assert run[:-1] == [*tpu, "ssh", "abl-1", zone, "--worker=all"]
    cd, main = run[-1].removeprefix("--command=").split(" && ")
    assert cd == "cd scale_ablation"
    flags = ["--config=experiments/base.py:quick", "--workdir=runs/tpu", "--config.policy=none"]
    assert shlex.split(main) == [".venv/bin/python", "-m", "scale_ablation.main", *flags]
    assert mkdir == ["mkdir", "-p", "runs"]
    remote = "abl-1:scale_ablation/runs/tpu"
    assert fetch == [*tpu, "scp", "--recurse", remote, "runs", zone, "--worker=0"]
    assert delete == [*tpu, "delete", "abl-1", zone, "--quiet"]


def test_tpu_passes_imports_of_files_in_the_checkout(env):
    args = ["--dry_run", "--zone=z", "--imports=experiments/base.py,my_package.policies"]
    result = bash("tpu_vm.sh", *args, env=env)
    assert result.returncode == 0, result.stderr
    main = shlex.split(commands(result.stdout)[4][-1].split(" && ")[1])
    assert main[-1] == "--imports=experiments/base.py,my_package.policies"


@pytest.mark.parametrize(
    ("imports", "says"),
    [("missing.py", "file not found"), ("{outside}", "outside the checkout"),
     (str(REPO / "experiments/base.py"), "relative to the repo root")],
)
def test_tpu_refuses_imports_that_cannot_travel(imports, says, env, tmp_path):
    outside = tmp_path / "my_policy.py"
    outside.write_text("")
    result = bash("tpu_vm.sh", "--dry_run", "--zone=z",
                  f"--imports={imports.format(outside=outside)}", env=env)
    assert_one_line_error(result)
    assert says in result.stderr


def test_tpu_defaults_and_environment(env):
    env |= {"TPU_ZONE": "us-central2-b", "TPU_NAME": "from-env"}
    result = bash("tpu_vm.sh", "--dry_run", "--version=custom-runtime", env=env)
    assert result.returncode == 0, result.stderr
    printed = commands(result.stdout)
    assert printed[0][5:] == [
        "from-env",
        "--zone=us-central2-b",
        "--accelerator-type=v4-8",
        "--version=custom-runtime",
    ]
    assert "--workdir=runs/base" in printed[4][-1]
    assert all("delete" not in command for command in printed)


@pytest.mark.parametrize(
    "args",
    [
        ["--type=v4-8"],  # no zone
        ["--zone=z", "--bogus"],
        ["--zone=z", "--name", "x"],
        ["--zone=z", "--name=Not_Valid"],
        ["--zone=z", "--type=v4"],
        ["--zone=z", "--config=experiments/missing.py"],
    ],
)
def test_tpu_bad_arguments(args, env):
    assert_one_line_error(bash("tpu_vm.sh", "--dry_run", *args, env=env))


# wandb_sweep.py

EXPERIMENT = """
import ml_collections

def get_config(arg=None):
    config = ml_collections.ConfigDict()
    config.policy = "inv_sqrt_dk"
    config.model = ml_collections.ConfigDict({"head_dim": 32})
    config.train = ml_collections.ConfigDict({"lr": 3e-3})
    config.wandb = ml_collections.ConfigDict({"tags": ()})
    return config

def sweep(arg=None):
    if arg == "zip":  # not a product: head_dim follows policy; one point adds a tuple field
        points = [{"policy": "none", "model.head_dim": 16}, {"policy": "inv_dk", "model.head_dim": 64}]
        return points + [{"policy": "fixed:0.1", "wandb.tags": ("a", "b's")}]
    if arg == "typo":
        return [{"policy": "none", "model.headdim": 16}]
    return [
        {"policy": policy, "model.head_dim": head_dim, "train.lr": 1e-5}
        for policy in ("none", "inv_sqrt_dk", "log:2")
        for head_dim in (16, 64)
    ]
"""


@pytest.fixture
def experiment_file(tmp_path):
    path = tmp_path / "exp.py"
    path.write_text(textwrap.dedent(EXPERIMENT))
    return path


def wandb_sweep(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(LAUNCH / "wandb_sweep.py"), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )


def agent_runs(definition: dict, points: list[dict], env: dict) -> list[list[str]]:
    """What `python` receives when W&B's agent runs each parameter assignment in `points`."""
    from wandb.sdk.launch.sweeps.utils import create_sweep_command_args

    received = []
    for index, point in enumerate(points):
        sweep_vars = create_sweep_command_args(
            {"args": {k: {"value": v} for k, v in point.items()}}
        )
        sweep_vars["env"] = ["/usr/bin/env"]
        command = []
        for element in definition["command"]:  # as wandb_agent.py: whole-element macros only
            is_macro = element.startswith("${") and element.endswith("}")
            command += sweep_vars.get(element[2:-1], []) if is_macro else [element]
        fake_python = Path(env["PATH"].split(":")[0]) / "python"
        fake_python.write_text(
            f"#!{sys.executable}\nimport json, sys; print(json.dumps(sys.argv[1:]))\n"
        )
        result = subprocess.run(
            command, capture_output=True, text=True, env=env | {"WANDB_RUN_ID": f"id{index}"}
        )
        assert result.returncode == 0, result.stderr
        received.append(json.loads(result.stdout))
    return received


def test_wandb_product_grid_becomes_config_parameters(experiment_file, tmp_path, env):
    out = tmp_path / "sweep.yaml"
    spec = str(experiment_file)
    result = wandb_sweep(f"--config={spec}", f"--out={out}", "--project=P", "--workdir=runs/w")
    assert result.returncode == 0, result.stderr
    definition = yaml.safe_load(out.read_text())
    grid = experiment.load_grid(spec)
    assert definition["method"] == "grid" and definition["project"] == "P"
    assert "${args}" in definition["command"]
    parameters = definition["parameters"]
    assert set(parameters) == {"config.policy", "config.model.head_dim", "config.train.lr"}
    keys = list(parameters)
    expanded = [
        dict(zip(keys, values, strict=True))
        for values in itertools.product(*(parameters[key]["values"] for key in keys))
    ]
    as_parameters = [{f"config.{k}": v for k, v in point.items()} for point in grid]
    assert sorted(map(repr, expanded)) == sorted(map(repr, as_parameters))
    assert len(expanded) == len(grid)

    received = agent_runs(definition, expanded, env)
    for index, (argv, point) in enumerate(zip(received, expanded, strict=True)):
        overrides = {key.removeprefix("config."): value for key, value in point.items()}
        assert argv[:4] == [
            "-m",
            "scale_ablation.main",
            f"--config={spec}",
            f"--workdir=runs/w/id{index}",
        ]
        assert sorted(argv[4:]) == sorted(experiment.override_flags(overrides))


def test_wandb_non_product_grid_becomes_named_points(experiment_file, env):
    spec = f"{experiment_file}:zip"
    result = wandb_sweep(f"--config={spec}")
    assert result.returncode == 0, result.stderr
    definition = yaml.safe_load(result.stdout)
    grid = experiment.load_grid(spec)
    names = [experiment.run_name(point) for point in grid]
    assert definition["method"] == "grid" and "${args}" in definition["command"]
    assert definition["parameters"] == {"point": {"values": names}}

    received = agent_runs(definition, [{"point": name} for name in names], env)
    for argv, point, name in zip(received, grid, names, strict=True):
        assert argv == [
            "-m",
            "scale_ablation.main",
            f"--config={spec}",
            f"--workdir=runs/wandb_exp_zip/{name}",
            *experiment.override_flags(point),
        ]
    with pytest.raises(AssertionError, match="unknown point"):
        agent_runs(definition, [{"point": "policy=other"}], env)


@pytest.fixture(scope="module")
def wandb_sweep_module():
    spec = importlib.util.spec_from_file_location("wandb_sweep", LAUNCH / "wandb_sweep.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "grid",
    [
        [{"a": 1, "b": 1}, {"a": 2, "b": 2}],  # diagonal
        [{"a": 1, "b": 1}, {"a": 1, "b": 2}, {"a": 2, "b": 1}],  # one corner missing
        [{"a": 1}, {"a": 1}],  # a point twice
        [{"a": 1}, {"a": 2, "b": 1}],  # different keys
        [{}],  # nothing swept
    ],
)
def test_product_detection_rejects_non_products(grid, wandb_sweep_module):
    assert wandb_sweep_module.product_parameters(grid) is None


def test_product_detection_accepts_products(wandb_sweep_module):
    grid = [{"b": b, "a": a} for a in (1, True, 1.0) for b in ((1, 2), "x")]
    parameters = wandb_sweep_module.product_parameters(grid)
    assert parameters == {
        "config.b": {"values": ["(1,2)", "x"]},
        "config.a": {"values": [1, True, 1.0]},
    }
    assert len(wandb_sweep_module.expand(parameters)) == len(grid)


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--config=experiments/missing.py"],
        ["--config=experiments/base.py", "--bogus"],
        ["--config=experiments/base.py", "stray"],
        ["--config={exp}:typo"],
    ],
)
def test_wandb_bad_arguments(args, experiment_file):
    result = wandb_sweep(*(arg.format(exp=experiment_file) for arg in args))
    assert_one_line_error(result)
