"""A command that writes a result writes it whole or not at all (issue 50, paths 3 to 5).

`report` builds its folder beside the destination and swaps it in by one rename, so a kill or
an error half way (a truncated refined.json) leaves the previous report as it was; `publish`
does the same with the whole study folder (report and run files together), and `--record_only`
with run_files; their staging folders, left by a killed process, go at the next run and are
ignored by git meanwhile. A run resumed from its final checkpoint keeps its failure kinds.
"""

from __future__ import annotations

import json
import pathlib
import subprocess

import pytest
from helpers import REPO, snapshot, tiny_config
from test_report_synthetic import EXPERIMENT, write_run

from scale_ablation import publish, report
from scale_ablation.training import train

POLICIES = ("inv_sqrt_dk", "none", "inv_dk", "qk_layernorm")


def small_sweep(root: pathlib.Path) -> pathlib.Path:
    """Sixteen synthetic runs (test_report_synthetic's shapes) and the experiment whose claims
    judge them."""
    (root / "claims_experiment.py").write_text(EXPERIMENT)
    sweep = root / "sweep"
    runs = [write_run(sweep, policy, lr, seed) for policy in POLICIES for lr in (1e-3, 1e-2)
            for seed in (0, 1)]
    (sweep / "sweep.json").write_text(json.dumps(
        {"config": str(root / "claims_experiment.py"), "runs": runs}))
    return sweep


def dead_pid() -> int:
    """The id of a process that has ended."""
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


@pytest.fixture
def sweep(tmp_path) -> pathlib.Path:
    sweep = small_sweep(tmp_path)
    report.write_report(str(sweep), plots=False)  # the tables and claims: what the tests read
    return sweep


# ------------------------------------------------ report


def test_a_report_stopped_half_way_leaves_the_previous_report_whole(sweep, monkeypatch):
    """A Ctrl-C among the plots, after the tables are written: the previous report stays as it
    was, file for file, and no staging folder is left beside it."""
    before = snapshot(sweep / "report")
    assert {"summary.csv", "summary.md", "claims.md"} <= set(before)

    def stopped(runs, rows, out):
        (pathlib.Path(out) / "val_loss_curves.png").write_bytes(b"half a plot")
        raise KeyboardInterrupt

    monkeypatch.setattr(report.report_plots, "write_plots", stopped)
    with pytest.raises(KeyboardInterrupt):
        report.write_report(str(sweep))
    assert snapshot(sweep / "report") == before
    assert not [p for p in sweep.iterdir() if p.name.startswith(".report")]


def test_a_truncated_refined_json_fails_before_the_report_is_touched(sweep):
    before = snapshot(sweep / "report")
    (sweep / "refined.json").write_text('{"rounds": [[{"name": ')
    with pytest.raises(ValueError, match=r"refined\.json") as error:
        report.write_report(str(sweep), plots=False)
    assert "\n" not in str(error.value)
    assert snapshot(sweep / "report") == before


def test_a_killed_report_s_staging_folder_goes_at_the_next_report(sweep):
    left = sweep / f".report-staging-{dead_pid()}-abcdefgh"
    (left / "summary.md").parent.mkdir()
    (left / "summary.md").write_text("half")
    report.write_report(str(sweep), plots=False)
    assert not left.exists()
    assert (sweep / "report" / "summary.md").read_text().strip()


def test_the_report_replaced_whole_drops_what_the_new_one_does_not_write(sweep):
    """Swapped in whole: a file the previous report had and this one does not write is gone
    (a stale plot beside new tables), the W&B summary run's id file is kept."""
    (sweep / "report" / "stale_plot.png").write_bytes(b"old")
    (sweep / "report" / "wandb_run_id.txt").write_text("abc\n")
    report.write_report(str(sweep), plots=False)
    assert not (sweep / "report" / "stale_plot.png").exists()
    assert (sweep / "report" / "wandb_run_id.txt").read_text() == "abc\n"


# ------------------------------------------------ publish


def test_a_publish_stopped_half_way_leaves_the_previous_publish_whole(sweep, tmp_path,
                                                                       monkeypatch):
    dest = tmp_path / "results" / "study"
    dest.parent.mkdir()
    publish.publish(str(sweep), str(dest))
    (dest / "README.md").write_text("hand-written\n")
    (dest / "old_plot.png").write_bytes(b"a plot the report no longer draws")
    before = snapshot(dest)

    install = publish._install_report

    def stopped(*args, **kwargs):  # the new report in, the runs' records not yet
        install(*args, **kwargs)
        raise OSError("stopped after installing the report")

    with monkeypatch.context() as patch:
        patch.setattr(publish, "_install_report", stopped)
        with pytest.raises(OSError, match="stopped"):
            publish.publish(str(sweep), str(dest))
    assert snapshot(dest) == before
    assert sorted(p.name for p in dest.parent.iterdir()) == ["study"]
    runs, _ = publish.publish(str(sweep), str(dest))  # the rerun completes it
    assert (dest / "README.md").read_text() == "hand-written\n"
    assert not (dest / "old_plot.png").exists()
    rows = (dest / "summary.csv").read_text().strip().splitlines()[1:]
    assert len(rows) == runs == len(publish.finished_runs(str(sweep)))


def test_publish_removes_the_staging_folders_a_killed_publish_left(sweep, tmp_path):
    dest = tmp_path / "results" / "study"
    dest.mkdir(parents=True)
    left = [dest.parent / f".study-publishing-{dead_pid()}-abcdefgh",
            dest.parent / ".study-publishing-abcdefgh"]  # the names of earlier versions
    for folder in left:
        (folder / "run_files").mkdir(parents=True)
    publish.publish(str(sweep), str(dest))
    assert sorted(p.name for p in dest.parent.iterdir()) == ["study"]


def test_a_stash_removes_the_staging_folders_a_killed_stash_left(sweep, tmp_path):
    dest = tmp_path / "pending" / "study"
    left = [dest / f".run_files-staging-{dead_pid()}-abcdefgh", dest / ".run_files-abcdefgh"]
    for folder in left:
        (folder / "a_run").mkdir(parents=True)
    count = publish.stash(str(sweep), str(dest))
    assert not any(folder.exists() for folder in left)
    assert count == len(publish.finished_runs(str(sweep)))


def test_git_ignores_every_staging_folder(tmp_path):
    """What `staging` names its folders (taken from a real staging), and the names of earlier
    versions, under the folders publish and stash write to."""
    from scale_ablation.records import staging

    with staging.staged(tmp_path / "study", "publishing") as folder:
        publishing = pathlib.Path(folder).name
    with staging.staged(tmp_path / "run_files") as folder:
        stashing = pathlib.Path(folder).name
    paths = [f"experiments/results/{publishing}/run_files/x/summary.json",
             f"experiments/pending/study/{stashing}/x/summary.json",
             "experiments/results/.study-publishing-abcdefgh/summary.md",
             "experiments/pending/study/.run_files-abcdefgh/x/summary.json"]
    for path in paths:
        ignored = subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=REPO,
                                 check=False)
        assert ignored.returncode == 0, f"{path} is not ignored"
    script = (REPO / "launch" / "cpu_studies.sh").read_text()
    assert 'git add "$pending"' not in script  # the folder the stash's staging sits in


# ------------------------------------------------ a run resumed from its final checkpoint


def test_a_run_resumed_from_its_final_checkpoint_keeps_its_failure_kinds(tmp_path):
    """Killed after its final checkpoint and before summary.json: the rerun writes the summary
    the uninterrupted run wrote, failure kinds and their first steps included."""
    workdir = tmp_path / "run"
    finished = train.train(tiny_config(), workdir)
    (workdir / "summary.json").unlink()
    resumed = train.train(tiny_config(), workdir)
    fields = ("status", "steps_completed", "failures", "spike_step", "entropy_collapse_step",
              "collapse_step", "final_val_bpb")
    assert {k: resumed[k] for k in fields} == {k: finished[k] for k in fields}
    assert isinstance(finished["failures"], list)


# ------------------------------------------------ the swap where renameat2 is missing


def test_the_two_rename_swap_restores_a_folder_a_kill_left_between_them(tmp_path, monkeypatch):
    """Without an atomic exchange the old folder is renamed aside, then the new one in; a kill
    between the two leaves no folder at the destination but the old one whole aside, which the
    next staging puts back before it builds."""
    from scale_ablation.records import staging

    monkeypatch.setattr(staging, "_exchange", lambda new, dest: False)
    dest = tmp_path / "report"
    for text in ("first", "second"):
        with staging.staged(dest) as folder:
            (pathlib.Path(folder) / "summary.md").write_text(text)
    assert (dest / "summary.md").read_text() == "second"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]
    dest.rename(tmp_path / f".report-{staging.OLD}-{dead_pid()}")  # killed between the renames
    seen = []
    with staging.staged(dest) as folder:
        seen.append((dest / "summary.md").read_text())  # put back before the build
        (pathlib.Path(folder) / "summary.md").write_text("third")
    assert seen == ["second"] and (dest / "summary.md").read_text() == "third"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]
