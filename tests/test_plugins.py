"""Policies from outside the package: `--imports` (a file or a module), an installed package's
entry point, `--add_policies`, the conformance suite on a user's module, and the errors of each.

The checks look at what the commands leave behind: each run's own config.json and summary.json,
the process ids the user's file records when it is imported, pytest's JUnit report, the files
(none) that a refused command writes.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import os
import pathlib
import subprocess
import sys
import xml.etree.ElementTree as ET
import zipfile

import pytest
import yaml
from helpers import OWN_CACHE, TINY_MODEL, experiment_source, read_json, snapshot

from experiments import dk_sweep
from scale_ablation.model import plugins, policies
from scale_ablation.sweeping import sweep_runners
from scale_ablation.training import experiment_files as experiment

REPO = pathlib.Path(__file__).resolve().parents[1]
ENV = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}

# A user's policy file: 0.5/√d_k, and the id of every process that imports it.
USER_POLICY = '''
import math
import os

from scale_ablation.model import policies

if os.environ.get("USER_POLICY_LOG"):
    with open(os.environ["USER_POLICY_LOG"], "a") as log:
        log.write(f"{os.getpid()}\\n")


@policies.register("{name}")
def half_sqrt(arg):
    return policies.scalar(lambda head_dim: 0.5 / math.sqrt(head_dim))
'''

TINY_GRIDS = {
    "user": [{"policy": "user_half_sqrt", "train.seed": 0},
             {"policy": "user_half_sqrt", "train.seed": 1}],
    "builtin": [{"policy": "inv_sqrt_dk"}],
}
TINY_EXPERIMENT = experiment_source(
    "A tiny experiment for tests/test_plugins.py.",
    {**TINY_MODEL, "train.steps": 4, "train.warmup_steps": 0,
     "train.log_every": 2, "train.eval_every": 2, "train.diag_every": 0,
     "checkpoint.every": 4, "wandb.mode": "offline"},
    f"{TINY_GRIDS!r}[arg]")


def write(path: pathlib.Path, text: str) -> pathlib.Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def run(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env or ENV,
                          capture_output=True, text=True, timeout=timeout)


def assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.fixture(scope="module")
def tiny_experiment(tmp_path_factory) -> pathlib.Path:
    return write(tmp_path_factory.mktemp("experiment") / "tiny.py", TINY_EXPERIMENT)


# --------------------------------------------------------------------------- the grid


def test_add_policies_gives_the_dk_sweep_one_more_policy():
    grid = experiment.load_grid(str(REPO / "experiments/dk_sweep.py:quick"),
                                ["mine:0.75", "none"])
    # The grid the experiment file would have with the policy in its own list: built here from
    # its constants, not by the code under test. "none" is there already and is not repeated.
    expected = [
        {"policy": policy, "model.num_heads": heads, "model.head_dim": head_dim,
         "model.init": init, "train.lr": lr, "train.seed": 0}
        for policy_list in (dk_sweep.QUICK_POLICIES, ("mine:0.75",)) for init in dk_sweep.INITS
        for policy in policy_list for heads, head_dim in dk_sweep.cells("quick")
        for lr in dk_sweep.QUICK_LRS
    ]
    assert grid == expected
    assert [list(point) for point in grid] == [list(point) for point in expected]  # key order


def test_add_policies_to_a_grid_without_a_policy_key():
    grid = [{"train.lr": 0.1}, {"train.lr": 0.2}, {"train.lr": 0.1}]
    added = experiment.with_policies(grid, ["a", "b"])
    assert added[:3] == grid
    lrs = sorted({point["train.lr"] for point in grid})
    assert added[3:] == [{"policy": p, "train.lr": lr} for p, lr in itertools.product("ab", lrs)]
    assert experiment.with_policies(grid, []) == grid


# --------------------------------------------------------------------------- in process


def test_register_refuses_a_taken_name():
    with pytest.raises(ValueError, match=r"'inv_sqrt_dk' is registered twice: by "
                                         r"scale_ablation\.model\.policies and by"):
        policies.register("inv_sqrt_dk")(lambda arg: policies.scalar(lambda d: 1.0))
    assert policies.get("inv_sqrt_dk").base_scale(64) == 1 / 8  # the original is kept


def test_load_imports_files_and_modules(tmp_path, monkeypatch):
    # The file imports a helper beside it, as a script may.
    write(tmp_path / "plugin_helper.py", "FACTOR = 0.5\n")
    text = USER_POLICY.replace("{name}", "pl_by_file").replace("0.5 /", "plugin_helper.FACTOR /")
    by_file = write(tmp_path / "plugin_by_file.py", "import plugin_helper\n" + text)
    write(tmp_path / "pkg" / "plugin_pkg" / "__init__.py", "")
    write(tmp_path / "pkg" / "plugin_pkg" / "mod.py", USER_POLICY.replace("{name}", "pl_by_mod"))
    monkeypatch.syspath_prepend(str(tmp_path / "pkg"))
    modules = plugins.load([str(by_file), "plugin_pkg.mod"])
    assert [m.__name__ for m in modules] == ["plugin_by_file", "plugin_pkg.mod"]
    assert {"pl_by_file", "pl_by_mod"} <= set(policies.available())
    assert policies.get("pl_by_file").base_scale(16) == 0.5 / 4
    # Loading again (another entry point of the same process) imports nothing twice.
    assert plugins.load([str(by_file), "plugin_pkg.mod"]) == modules
    assert sweep_runners.imports_args([str(by_file), "plugin_pkg.mod"]) == [
        f"--imports={by_file},plugin_pkg.mod"]
    assert sweep_runners.imports_args([]) == []


BAD_IMPORTS = {
    # name: (file contents or None for no file, what the error line says)
    "missing": (None, "no such file"),
    "raises": ("import math\nx = 1 / 0\n", "ZeroDivisionError: division by zero"),
    "duplicate": (USER_POLICY.replace("{name}", "none"), "'none' is registered twice"),
    "syntax": ("def broken(:\n", "SyntaxError"),
}


@pytest.mark.parametrize("case", sorted(BAD_IMPORTS))
def test_load_errors_name_the_entry(case, tmp_path):
    text, message = BAD_IMPORTS[case]
    path = tmp_path / f"bad_{case}.py"
    if text is not None:
        write(path, text)
    with pytest.raises(ValueError) as error:
        plugins.load([str(path)])
    assert str(error.value).startswith(f"--imports={path}: ")
    assert message in str(error.value) and "\n" not in str(error.value)
    assert f"bad_{case}" not in sys.modules  # a failed import leaves no half-made module


def test_load_error_for_a_module_that_is_not_there():
    with pytest.raises(ValueError, match=r"^--imports=no_such_plugin_mod: ModuleNotFoundError"):
        plugins.load(["no_such_plugin_mod"])


def test_load_skips_blanks_and_repeats_and_refuses_what_is_no_module(tmp_path, monkeypatch):
    path = write(tmp_path / "plugin_once.py", USER_POLICY.replace("{name}", "pl_once"))
    monkeypatch.syspath_prepend(str(tmp_path))  # its folder on the path already: not added twice
    assert [m.__name__ for m in plugins.load(["", str(path), f" {path} ", " "])] == ["plugin_once"]
    assert sys.path.count(str(tmp_path)) == 1
    for name, says in (("notes.txt", "not a Python file"),  # no loader for the suffix
                       ("json.py", "a module named 'json' is already imported")):
        with pytest.raises(ValueError, match=f"^--imports={tmp_path / name}: {says}"):
            plugins.load([str(write(tmp_path / name, "x = 1\n"))])


def test_a_second_composer_and_a_broken_entry_point_are_refused(monkeypatch):
    import importlib.metadata

    with pytest.raises(ValueError, match="a policy composer is already registered"):
        policies.register_composer(lambda first, second: first)
    broken = importlib.metadata.EntryPoint("sa_gone", "sa_gone_module", policies.ENTRY_POINT_GROUP)
    monkeypatch.setitem(policies._installed, "loaded", False)  # as a fresh process
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [broken])
    with pytest.raises(ValueError, match=r"^policy plugin sa_gone = sa_gone_module \(from an "
                                         r"installed package\) does not import: "
                                         r"ModuleNotFoundError: No module named 'sa_gone_module'$"):
        policies.available()


# --------------------------------------------------------------------------- command line


# The three the command line must survive (a SyntaxError takes the path of any exception).
@pytest.mark.parametrize("case", ["missing", "raises", "duplicate"])
def test_sweep_refuses_a_bad_import_and_writes_nothing(case, tmp_path):
    text, message = BAD_IMPORTS[case]
    path = tmp_path / "user" / f"bad_{case}.py"
    if text is not None:
        write(path, text)
    out = tmp_path / "out"
    result = run("-m", "scale_ablation.sweep", "--config=experiments/dk_sweep.py:quick",
                 f"--workdir={out / 'sweep'}", f"--imports={path}", env={**ENV, **OWN_CACHE})
    assert_one_line_error(result, f"error: --imports={path}: ", message)
    assert not out.exists()  # no sweep directory, no .jax_cache beside it


@pytest.mark.parametrize("tool", ["main", "report", "wandb_sweep"])
def test_every_entry_point_refuses_a_missing_import(tool, tmp_path):
    missing = tmp_path / "no_such_policy.py"
    sweep_dir = tmp_path / "sweep"
    sweep_dir.mkdir()
    args = {
        "main": ["-m", "scale_ablation.main", "--config=experiments/base.py:quick",
                 f"--workdir={tmp_path / 'run'}"],
        "report": ["-m", "scale_ablation.report", str(sweep_dir)],
        "wandb_sweep": ["launch/wandb_sweep.py", "--config=experiments/dk_sweep.py:quick",
                        f"--out={tmp_path / 'sweep.yaml'}"],
    }[tool]
    before = snapshot(tmp_path)
    result = run(*args, f"--imports={missing}")
    assert_one_line_error(result, f"--imports={missing}: no such file")
    assert snapshot(tmp_path) == before


@pytest.mark.slow  # a parallel sweep in subprocesses, ~20 s; one process: the fast tier
def test_parallel_sweep_imports_the_users_file_in_every_process(tmp_path, tiny_experiment):
    user_file = write(tmp_path / "user_policy.py", USER_POLICY.replace("{name}", "user_half_sqrt"))
    log = tmp_path / "imported_by.txt"
    sweep_dir = tmp_path / "sweep"
    result = run("-m", "scale_ablation.sweep", f"--config={tiny_experiment}:user",
                 f"--workdir={sweep_dir}", f"--imports={user_file}", "--parallel=2",
                 env={**ENV, "USER_POLICY_LOG": str(log)})
    assert result.returncode == 0, result.stdout + result.stderr
    runs = read_json(sweep_dir / "sweep.json")["runs"]
    assert len(runs) == 2 and {r["status"] for r in runs} == {"completed"}
    for record in runs:
        run_dir = sweep_dir / record["name"]
        assert read_json(run_dir / "config.json")["policy"] == "user_half_sqrt"
        assert read_json(run_dir / "summary.json")["status"] == "completed"
    # The sweep itself and each of its two run processes imported the file, once each.
    pids = log.read_text().split()
    assert len(pids) == len(set(pids)) == 1 + len(runs)
    # sweep.json keeps the file by its absolute path, and a later report, run without
    # --imports, imports it from there (its runs' policy is registered nowhere else).
    assert read_json(sweep_dir / "sweep.json")["imports"] == [str(user_file.resolve())]
    report = run("-m", "scale_ablation.report", str(sweep_dir),
                 env={**ENV, "USER_POLICY_LOG": str(log)})
    assert report.returncode == 0, report.stdout + report.stderr
    assert len(log.read_text().split()) == 2 + len(runs)


def test_wandb_sweep_definition_carries_the_imports(tmp_path):
    user_file = write(tmp_path / "wandb_user_policy.py", USER_POLICY.replace("{name}", "w_half"))
    out = tmp_path / "sweep.yaml"
    result = run("launch/wandb_sweep.py", "--config=experiments/dk_sweep.py:quick",
                 f"--imports={user_file}", "--add_policies=w_half", f"--out={out}")
    assert result.returncode == 0, result.stderr
    definition = yaml.safe_load(out.read_text())
    # The d_k sweep's cells pair num_heads with d_k (its two arms), so the grid is not a product
    # and W&B enumerates a table of named points: the file's points, then the added policy at
    # every cell, init and LR.
    names = definition["parameters"]["point"]["values"]
    added = [n for n in names if n.startswith("policy=w_half,")]
    assert len(names) == len(dk_sweep.sweep("quick")) + len(added)
    assert len(added) == (len(dk_sweep.cells("quick")) * len(dk_sweep.INITS)
                          * len(dk_sweep.QUICK_LRS))
    assert f"--imports={user_file} --workdir=" in definition["command"][3]
    # Without the import the added policy is unknown: refused here, not in every W&B run.
    result = run("launch/wandb_sweep.py", "--config=experiments/dk_sweep.py:quick",
                 "--add_policies=w_half", f"--out={out}.2")
    assert_one_line_error(result, "unknown scale policy 'w_half'")
    assert not pathlib.Path(f"{out}.2").exists()


# --------------------------------------------------------------------------- installed package


def write_wheel(directory: pathlib.Path, module: str, source: str) -> pathlib.Path:
    """A wheel of package `module` whose entry point in `scale_ablation.model.policies` is itself."""
    info = f"{module}-0.1.dist-info"
    files = {
        f"{module}/__init__.py": source,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\n"
                         "Tag: py3-none-any\n",
        f"{info}/entry_points.txt": f"[{policies.ENTRY_POINT_GROUP}]\n{module} = {module}\n",
    }
    record = []
    for name, text in files.items():
        digest = hashlib.sha256(text.encode()).digest()
        encoded = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
        record.append(f"{name},sha256={encoded},{len(text.encode())}")
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    wheel = directory / f"{module}-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return wheel


def install(tmp_path: pathlib.Path, module: str, source: str) -> dict:
    """pip-install the package into a directory of its own; the environment that sees it."""
    target = tmp_path / "site"
    wheel = write_wheel(tmp_path, module, source)
    result = run("-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                 f"--target={target}", str(wheel))
    assert result.returncode == 0, result.stderr
    return {**ENV, "PYTHONPATH": os.pathsep.join(filter(None, [str(target),
                                                                ENV.get("PYTHONPATH")]))}


@pytest.mark.slow  # a package on the path, then a sweep, ~15 s; its entry point read: below
def test_an_installed_package_adds_its_policy_with_no_flag(tmp_path, tiny_experiment):
    env = install(tmp_path, "sa_demo_policies", USER_POLICY.replace("{name}", "pkg_half"))
    listed = run("-c", "from scale_ablation.model import policies; print(policies.available())", env=env)
    assert "'pkg_half'" in listed.stdout, listed.stderr
    assert "'pkg_half'" not in run("-c", "from scale_ablation.model import policies; "
                                         "print(policies.available())").stdout

    sweep_dir = tmp_path / "sweep"
    result = run("-m", "scale_ablation.sweep", f"--config={tiny_experiment}:builtin",
                 f"--workdir={sweep_dir}", "--add_policies=pkg_half", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    runs = read_json(sweep_dir / "sweep.json")["runs"]
    assert [r["overrides"]["policy"] for r in runs] == ["inv_sqrt_dk", "pkg_half"]
    assert {r["status"] for r in runs} == {"completed"}
    assert read_json(sweep_dir / runs[1]["name"] / "config.json")["policy"] == "pkg_half"


def test_an_installed_package_that_does_not_import_is_one_line(tmp_path):
    env = install(tmp_path, "sa_broken_policies", "raise RuntimeError('plugin is broken')\n")
    out = tmp_path / "out"
    result = run("-m", "scale_ablation.sweep", "--config=experiments/dk_sweep.py:quick",
                 f"--workdir={out / 'sweep'}", env=env)
    assert_one_line_error(result, "sa_broken_policies", "RuntimeError: plugin is broken")
    assert not out.exists()


# --------------------------------------------------------------------------- conformance

# Its learned parameter never reaches the scale: the conformance suite's gradient check must say
# so, while the well-made policy beside it passes everything.
BROKEN_LEARNED = '''
import math

import jax.numpy as jnp

from scale_ablation.model import policies


@policies.register("user_broken_learned")
def broken(arg):
    return policies.ScalePolicy(
        base_scale_fn=lambda head_dim: 1 / math.sqrt(head_dim),
        init_fn=lambda rng, *, num_heads, head_dim, base_scale: {"s": jnp.ones((num_heads,))},
    )
'''


def test_conformance_suite_runs_on_a_users_module(tmp_path):
    good = write(tmp_path / "user_good.py", USER_POLICY.replace("{name}", "user_good_half"))
    broken = write(tmp_path / "user_broken.py", BROKEN_LEARNED)
    junit = tmp_path / "junit.xml"
    result = run("-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_policies.py",
                 f"--imports={good},{broken}", "-k", "user_good_half or user_broken_learned",
                 f"--junitxml={junit}", timeout=600)
    outcomes: dict[str, dict[str, int]] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        policy = "good" if "user_good_half" in case.get("name") else "broken"
        failed = case.find("failure") is not None or case.find("error") is not None
        counts = outcomes.setdefault(policy, {"passed": 0, "failed": 0})
        counts["failed" if failed else "passed"] += 1
    assert outcomes["good"]["failed"] == 0 and outcomes["good"]["passed"] > 0, result.stdout
    assert outcomes["broken"]["failed"] >= 1, result.stdout
    assert result.returncode == 1  # pytest: some tests failed
