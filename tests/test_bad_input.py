"""Bad input a user hits (issues 32 and 34): one line, exit 2, nothing created; and the
console lines a rerun and a sweep print.

Work directories that cannot hold a run (under /proc, /sys or a regular file), experiment files
that fail to import or return the wrong shape, `--add_policies` without the module that
registers the policy, a refused sweep under launch/local.sh, a rerun of a finished run.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import stat
import subprocess
import sys
import textwrap

from helpers import OWN_CACHE, QUICK, REPO, read_json, snapshot, tiny_config
from test_train_faults import ABSL_LOG, ENV, main_args, one_error_line, run_module

from scale_ablation import sweep
from scale_ablation.sweeping.progress import Progress
from scale_ablation.training import hooks

# ------------------------------------------------ work directories that cannot hold a run


WORKDIRS = {
    "under /proc": lambda tmp: pathlib.Path("/proc") / f"scale_ablation_test_{os.getpid()}",
    "under /sys": lambda tmp: pathlib.Path("/sys") / "scale_ablation_test",
    "under a regular file": lambda tmp: tmp / "a_file" / "run",
}


# ------------------------------------------------ experiment files


BAD_FILES = {
    "a syntax error": ("def get_config(arg=None:\n    pass\n", ["syntax error", ":1"]),
    "get_config raises": ("def get_config(arg=None):\n    raise RuntimeError('boom')\n",
                          ["get_config(None) raised RuntimeError: boom", ".py:2)"]),
    "an import that fails": ("import no_such_module_anywhere\n", ["failed to import",
                                                                   "no_such_module_anywhere"]),
    "get_config returns a dict": ("def get_config(arg=None):\n    return {}\n",
                                  ["must return an ml_collections.ConfigDict, got dict"]),
}
BAD_GRIDS = {"an int": ("3", "got int"), "a dict": ('{"train.seed": 1}', "got dict"),
             "a non-dict point": ("[1, 2]", "sweep(None)[0] must be a dict")}
# These and the work directories above are checked with every other bad invocation, in one
# process: test_every_bad_invocation_is_one_line_exit_2_and_creates_nothing.


def test_add_policies_without_imports_says_to_import_the_policy(tmp_path):
    args = [f"--config={QUICK}", f"--workdir={tmp_path / 'sweep'}", "--dry_run",
            "--add_policies=my_policy"]
    line = one_error_line(run_module("sweep", *args))
    assert "--add_policies=my_policy" in line and "--imports=" in line
    policy = tmp_path / "my_policy.py"
    policy.write_text("")  # imports, registers nothing: the hint has been followed
    line = one_error_line(run_module("sweep", *args, f"--imports={policy}"))
    assert "unknown scale policy 'my_policy'" in line and "add --imports" not in line


# ------------------------------------------------ launch/local.sh after a refused sweep


def test_local_sh_stops_after_a_refused_sweep(tmp_path):
    """A stand-in venv whose python logs each module it is asked to run: the sweep refuses
    (exit 2), and local.sh must then not run the report."""
    venv, calls = tmp_path / "venv", tmp_path / "calls.log"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(textwrap.dedent(f'''\
        #!/usr/bin/env bash
        case "$*" in
          *scale_ablation.sweep*) echo sweep >> {calls}; echo "error: refused" >&2; exit 2 ;;
          *scale_ablation.report*) echo report >> {calls}; exit 0 ;;
        esac
        exit 0
    '''))
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    (venv / ".scale_ablation-installed").touch()
    os.utime(venv / ".scale_ablation-installed",
             (2**31 - 1, 2**31 - 1))  # newer than pyproject.toml: no install
    result = subprocess.run(["bash", str(REPO / "launch" / "local.sh"), "experiments/base.py:quick",
                             str(tmp_path / "sweep")], env={**os.environ, "VENV": str(venv)},
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2, result.stderr
    assert calls.read_text().split() == ["sweep"]
    assert result.stderr.strip().splitlines() == ["error: refused"]


# ------------------------------------------------ what a rerun and a sweep say


def test_a_rerun_of_a_finished_run_says_already_finished_in_4_digits(tmp_path):
    first = run_module("main", *main_args(tmp_path / "run"))
    assert first.returncode == 0, first.stderr
    last = first.stdout.strip().splitlines()[-1]
    bpb = read_json(tmp_path / "run" / "summary.json")["final_val_bpb"]
    assert last.endswith(f"final val {bpb:.4g} bits per byte") and "already" not in last
    rerun = run_module("main", *main_args(tmp_path / "run"))
    assert rerun.returncode == 0, rerun.stderr
    assert rerun.stdout.strip().startswith("already finished, nothing trained (completed:")


def test_the_sweep_file_records_each_run_as_it_completes(tmp_path):
    """While the second run trains, sweep.json already says the first completed (a sweep
    killed then would otherwise say `pending` for it)."""
    sweep_dir = tmp_path / "sweep"
    points = [sweep.Point(f"seed={seed}", {"train.seed": seed},
                          tiny_config(**{"train.seed": seed})) for seed in (0, 1)]
    sweep_file = sweep.SweepFile(str(sweep_dir), QUICK, points, ())
    sweep_file.write()
    seen = {}

    def look(member, tick):
        if member.run.workdir.endswith("seed=1") and tick.step == 3:
            seen.update((r["name"], r["status"]) for r in read_json(sweep_dir / "sweep.json")["runs"])

    sweep.run_in_process(str(sweep_dir), points, Progress(2, 0),
                         sweep.RecordedOutcomes(sweep_file), together=False,
                         extra_hooks=[hooks.Periodic(1, look)], compile_ahead=False)
    assert seen == {"seed=0": "completed", "seed=1": "pending"}
    assert {r["status"] for r in read_json(sweep_dir / "sweep.json")["runs"]} == {"completed"}


# ------------------------------------------------ every command's bad invocations (issue 50)


HEADLINE = str(REPO / "experiments" / "headline.py") + ":quick"
USER_FILES = {  # --imports files whose import ends abnormally
    "keyboard.py": "raise KeyboardInterrupt\n",
    "exits.py": "import sys\nsys.exit(5)\n",
    "raises.py": "raise RuntimeError('boom')\n",
}


def bad_invocations(tmp: pathlib.Path) -> list[tuple[str, list[str], str | tuple[str, ...]]]:
    """(command, arguments, the text(s) the one error line must hold): every way of calling a
    command wrongly that the tests know of, the paths under `tmp` (see `study_fixtures`)."""
    sweep_args = [f"--config={HEADLINE}", f"--workdir={tmp / 'sweep'}"]
    run_args = [f"--config={QUICK}", f"--workdir={tmp / 'run'}"]
    coord_args = [f"--config={QUICK}", f"--out={tmp / 'coord'}"]
    source, study, mqar = str(tmp / "source"), str(tmp / "headline"), str(tmp / "mqar")
    published = str(REPO / "experiments" / "results" / "scale_one_fan_in")  # only read
    imports = {name: f"--imports={tmp / name}" for name in USER_FILES}
    cases = [
        ("sweep", [*sweep_args, "--budget_hours=abc"], "budget_hours"),
        ("sweep", [*sweep_args, "--budget_hours=nan"], "budget_hours"),
        ("sweep", [*sweep_args, "--budget_hours=-1"], "budget_hours"),
        ("sweep", [*sweep_args, "--refine", "--refine_rounds=0"], "refine_rounds"),
        ("sweep", [*sweep_args, "--refine", "--refine_rounds=-1"], "refine_rounds"),
        ("sweep", [*sweep_args, "--refine", "--refine_rounds=abc"], "refine_rounds"),
        ("sweep", [*sweep_args, "--refine_rounds=2"], "--refine"),
        ("sweep", [*sweep_args, "--max_members=-1"], "max_members"),
        ("sweep", [*sweep_args, "--parallel=abc"], "parallel"),
        ("sweep", [*sweep_args, "--parallel=0"], "parallel"),
        ("sweep", [*sweep_args, "--process_xla_flags=--xla_cpu_use_xnnpack=true"],
         "process_xla_flags"),
        ("sweep", [*sweep_args, "--no_such_flag"], "no_such_flag"),
        ("sweep", [*sweep_args, "--config.train.steps=5"], "config.train.steps"),
        ("sweep", [*sweep_args, "extra"], "unexpected arguments: extra"),
        ("sweep", [f"--workdir={tmp / 'sweep'}"], "--config"),
        ("sweep", [f"--config={HEADLINE.replace(':quick', ':nosuch')}",
                   f"--workdir={tmp / 'sweep'}"], "nosuch"),
        ("sweep", [f"--config={tmp / 'nosuch.py'}", f"--workdir={tmp / 'sweep'}"], "nosuch.py"),
        ("main", [*run_args, "extra"], "unexpected arguments: extra"),
        ("main", [*run_args, "--no_such_flag"], "no_such_flag"),
        ("main", [*run_args, "--config.train.nosuch=1"], "nosuch"),
        ("main", [*run_args, "--config.train.steps=abc"], "abc"),
        ("main", [f"--config={HEADLINE.replace(':quick', ':nosuch')}",
                  f"--workdir={tmp / 'run'}"], "nosuch"),
        ("report", [], "usage"),
        ("report", [source, "extra"], "unexpected arguments: extra"),
        ("report", [str(tmp / "nosuch")], "nosuch"),
        ("report", ["--no_such_flag", source], "no_such_flag"),
        ("report", [source, "--reference=nosuch_policy"], "nosuch_policy"),
        ("publish", [], "usage"),
        ("publish", [source, str(tmp / "dest"), "extra"], "unexpected arguments: extra"),
        ("publish", [source, str(tmp / "a_file")], "a_file"),
        ("publish", ["--no_such_flag", source, str(tmp / "dest")], "no_such_flag"),
        ("publish", [str(tmp / "nosuch"), str(tmp / "dest")], "nosuch"),
        ("publish", [source, str(tmp / "source" / "inside")], "contain"),
        ("publish", ["--record_only", source, str(tmp / "a_file")], "a_file"),
        ("rejudge", [], "usage"),
        ("rejudge", [study, "extra"], "unexpected arguments: extra"),
        ("rejudge", [str(tmp / "malformed")], "summary.csv"),
        ("rejudge", [study, f"--config={HEADLINE.replace(':quick', ':nosuch')}"], "nosuch"),
        ("rejudge", [mqar, f"--config={HEADLINE}"], "not this experiment's"),
        ("rejudge", ["--no_such_flag", study], "no_such_flag"),
        ("rejudge", [str(tmp / "nosuch")], "nosuch"),
        ("nonfinite", [], "usage"),
        ("nonfinite", [str(tmp / "diverged"), "extra"], "unexpected arguments: extra"),
        ("nonfinite", ["--no_such_flag", str(tmp / "diverged")], "no_such_flag"),
        ("nonfinite", [source], "no diverged run"),
        ("coord_check", [f"--out={tmp / 'coord'}"], "--config"),
        ("coord_check", [*coord_args, "--widths=abc"], "widths"),
        ("coord_check", [*coord_args, "--widths=64"], "widths"),
        ("coord_check", [*coord_args, "--steps=0"], "steps"),
        ("coord_check", [*coord_args, "--parametrizations=xx"], "parametrizations"),
        ("coord_check", [*coord_args, "--no_such_flag"], "no_such_flag"),
        ("coord_check", [*coord_args, "--config.train.nosuch=1"], "nosuch"),
        ("coord_check", [*coord_args, "extra"], "unexpected arguments: extra"),
        ("coord_check", [f"--config={QUICK}", f"--out={tmp / 'a_file'}"], "a_file"),
        ("main", [f"--config={QUICK}"], "--workdir"),
        ("sweep", [*sweep_args, "--add_policies=nosuch_policy"], "nosuch_policy"),
        ("report", [source, "--wandb_workspace=maybe"], "wandb_workspace"),
        ("nonfinite", [str(tmp / "nosuch")], "nosuch"),
        ("claims_table", ["--nosuch"], "usage"),
        ("claims_table", ["extra"], "usage"),
        ("wandb_study", [], "usage"),
        ("wandb_study", [published, "extra"], "unexpected arguments: extra"),
        ("wandb_study", ["--no_such_flag", published], "no_such_flag"),
        ("wandb_study", [str(tmp / "nosuch"), f"--out={tmp / 'wandb'}"], "nosuch"),
        ("wandb_study", [published, "--mode=bogus", f"--out={tmp / 'wandb'}"], "--mode"),
    ]
    for name, flag in imports.items():  # --imports contained, on every command that takes it
        cases += [("sweep", [*sweep_args, flag], name), ("main", [*run_args, flag], name),
                  ("report", [flag, source], name),
                  ("nonfinite", [flag, str(tmp / "diverged")], name)]
    cases.append(("sweep", [*sweep_args, f"--imports={tmp / 'missing.py'}"], "missing.py"))
    for workdir in workdirs(tmp).values():
        cases += [("main", main_args(workdir), f"--workdir {workdir}"),
                  ("sweep", [f"--config={QUICK}", f"--workdir={workdir}", "--dry_run"],
                   f"--workdir {workdir}")]
    for index, (_, expected) in enumerate(BAD_FILES.values()):
        cases += [(command, [f"--config={tmp / f'broken{index}.py'}",
                             f"--workdir={tmp / 'run'}"], tuple(expected))
                  for command in ("main", "sweep")]
    cases += [("sweep", [f"--config={tmp / f'grid{index}.py'}", f"--workdir={tmp / 'sweep'}"],
               expected) for index, (_, expected) in enumerate(BAD_GRIDS.values())]
    return cases


def workdirs(tmp: pathlib.Path) -> dict[str, pathlib.Path]:
    return {case: where(tmp) for case, where in WORKDIRS.items()}


def study_fixtures(tmp: pathlib.Path) -> None:
    """What the bad invocations name: a finished sweep (`source`), published studies' rows and
    claims (`headline`, `mqar`, `malformed`: a row with a cell too many), a diverged run, a
    regular file, the --imports files."""
    from test_report_synthetic import write_run

    runs = [write_run(tmp / "source", policy, 3e-3, seed) for policy in ("inv_sqrt_dk", "none")
            for seed in (0, 1)]
    (tmp / "source" / "sweep.json").write_text(json.dumps({"config": HEADLINE, "runs": runs}))
    for study, published in (("headline", "scale_one_fan_in"), ("mqar", "mqar_cpu"),
                             ("malformed", "scale_one_fan_in")):
        (tmp / study).mkdir()
        for name in ("summary.csv", "claims.md"):
            shutil.copy(REPO / "experiments" / "results" / published / name, tmp / study / name)
    with open(tmp / "malformed" / "summary.csv", "a") as f:
        f.write("x," * 60 + "x\n")
    (tmp / "diverged").mkdir()
    (tmp / "diverged" / "summary.json").write_text('{"status": "diverged"}')
    (tmp / "a_file").write_text("not a directory")
    for name, source in USER_FILES.items():
        (tmp / name).write_text(source)
    for index, (source, _) in enumerate(BAD_FILES.values()):
        (tmp / f"broken{index}.py").write_text(source)
    for index, (grid, _) in enumerate(BAD_GRIDS.values()):
        (tmp / f"grid{index}.py").write_text(textwrap.dedent(f'''
            from experiments import base

            def get_config(arg=None):
                return base.get_config("quick")

            def sweep(arg=None):
                return {grid}
        '''))


def test_every_bad_invocation_is_one_line_exit_2_and_creates_nothing(tmp_path):
    """Each command's flag, argument and config errors (issue 50's list and more), all run in
    one process (`command_forks`): exit 2, one line naming what is wrong, no file touched."""
    study_fixtures(tmp_path)
    cases = bad_invocations(tmp_path)
    before = snapshot(tmp_path)
    results = run_forked([(command, args) for command, args, _ in cases])
    wrong = []
    for (command, args, expected), result in zip(cases, results, strict=True):
        lines = [line for line in result["stderr"].splitlines()
                 if line.strip() and not ABSL_LOG.match(line)]
        expected = (expected,) if isinstance(expected, str) else expected
        if result["code"] != 2 or len(lines) != 1 or not all(e in lines[0] for e in expected):
            wrong.append(f"{command} {' '.join(args)}: exit {result['code']}, "
                         f"{len(lines)} lines: {result['stderr'][-300:]!r}")
    assert not wrong, f"{len(wrong)} of {len(cases)} bad invocations:\n" + "\n".join(wrong)
    assert snapshot(tmp_path) == before  # no .jax_cache beside a workdir either
    assert not any(workdir.exists() for workdir in workdirs(tmp_path).values())
    print(f"{len(cases)} of {len(cases)} bad invocations: one line, exit 2, nothing created")


def run_forked(invocations: list[tuple[str, list[str]]]) -> list[dict]:
    """Each (command, arguments) as `python -m scale_ablation.COMMAND ARGS` would run it, from
    one interpreter (`command_forks.py`): exit code, stdout and stderr of each."""
    result = subprocess.run(
        [sys.executable, str(pathlib.Path(__file__).with_name("command_forks.py"))],
        input=json.dumps([[command, args, str(REPO)] for command, args in invocations]),
        cwd=REPO, env={**ENV, **OWN_CACHE}, capture_output=True, text=True, timeout=600,
        check=True)
    return json.loads(result.stdout)
