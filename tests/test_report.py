"""The report's numbers against the runs' own files, recomputed here; LR sensitivity by hand.

The sweep is the tiny one of tests/test_sweep.py, built once per session (two learning rates of
one policy, a two-layer learned-scale run at another d_k, and a run that diverges).
"""

from __future__ import annotations

import csv
import json
import math
import pathlib
import re
import shutil
import statistics
import struct
import subprocess
import sys

import pytest
from helpers import read_json

from scale_ablation import report
from scale_ablation.analysis import comparisons, tables
from scale_ablation.records import wandb_offline

try:  # pytest's default import mode puts tests/ itself on sys.path
    from test_sweep import ENV, GRIDS, REPO, build_report_sweep
except ImportError:  # pragma: no cover - other import modes
    from tests.test_sweep import ENV, GRIDS, REPO, build_report_sweep

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PLOTS = (
    "val_loss_curves.png",
    "entropy_over_training.png",
    "learned_scale_vs_dk.png",
    "learned_scale_over_training.png",
    # The sweep has two learning rates of one policy: loss and logit growth against LR.
    "loss_vs_lr.png",
    "max_logit_over_training.png",
    "max_logit_vs_lr_layer0.png",
    "max_logit_vs_lr_layer1.png",
)


@pytest.fixture(scope="session")
def sweep_dir(tmp_path_factory) -> pathlib.Path:
    return build_report_sweep(tmp_path_factory)




def run_dirs(sweep_dir: pathlib.Path) -> list[pathlib.Path]:
    return [sweep_dir / entry["name"] for entry in read_json(sweep_dir / "sweep.json")["runs"]]


def metrics_rows(run_dir: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def csv_rows(sweep_dir: pathlib.Path) -> dict[str, dict]:
    with open(sweep_dir / "report" / "summary.csv", newline="") as f:
        return {row["name"]: row for row in csv.DictReader(f)}


def number(text: str) -> float | None:
    return None if text == "" else float(text)


def layer_values(row: dict, stat: str) -> list[float]:
    """Per-layer values only: not attn/layer0/head1/entropy, not attn/layer0/entropy_normalised."""
    pattern = re.compile(rf"attn/layer\d+/{stat}")
    return [v for k, v in row.items() if pattern.fullmatch(k) and v is not None]


def markdown_table(text: str) -> tuple[list[str], list[list[str]]]:
    """Header cells and body rows of the first table in `text`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| policy"))
    cells = lambda line: [c.strip() for c in line.strip().strip("|").split("|")]  # noqa: E731
    body = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        body.append(cells(line))
    return cells(lines[start]), body


def test_one_csv_row_per_run_with_its_summary(sweep_dir):
    rows = csv_rows(sweep_dir)
    assert sorted(rows) == sorted(d.name for d in run_dirs(sweep_dir))
    for run_dir in run_dirs(sweep_dir):
        row, summary = rows[run_dir.name], read_json(run_dir / "summary.json")
        config = read_json(run_dir / "config.json")
        assert row["status"] == summary["status"]
        assert number(row["final_val_bpb"]) == summary["final_val_bpb"]
        assert number(row["final_val_loss"]) == summary["final_val_loss"]
        assert number(row["diverged_at_step"]) == summary["diverged_at_step"]
        assert number(row["steps_completed"]) == summary["steps_completed"]
        assert row["policy"] == config["policy"]
        assert int(row["d_k"]) == config["model"]["head_dim"]
        assert float(row["lr"]) == config["train"]["lr"]
        assert_bits_are_nats_over_ln2(run_dir, summary)
    statuses = sorted(row["status"] for row in rows.values())
    assert statuses == ["completed", "completed", "completed", "diverged"]


def assert_bits_are_nats_over_ln2(run_dir: pathlib.Path, summary: dict) -> None:
    """Every bits-per-byte figure of a run is its loss in nats over ln 2."""
    if summary["final_val_loss"] is not None:
        assert summary["final_val_bpb"] == pytest.approx(summary["final_val_loss"] / math.log(2))
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    pairs = [(row[f"{split}/bpb"], row[f"{split}/loss"]) for row in rows for split in ("train", "val")
             if row.get(f"{split}/loss") is not None and math.isfinite(row[f"{split}/loss"])]
    assert pairs
    for bits, nats in pairs:
        assert bits == pytest.approx(nats / math.log(2))


def test_attention_columns_recomputed_from_metrics(sweep_dir):
    rows = csv_rows(sweep_dir)
    checked_layers = set()
    for run_dir in run_dirs(sweep_dir):
        metrics, row = metrics_rows(run_dir), rows[run_dir.name]
        with_entropy = [m for m in metrics if layer_values(m, "entropy")]
        assert with_entropy  # every run has its diagnostics at step 0, the diverged one too
        last = layer_values(with_entropy[-1], "entropy")
        checked_layers.add(len(last))
        assert float(row["final_entropy"]) == pytest.approx(statistics.fmean(last), rel=1e-12)
        logits = [v for m in metrics for v in layer_values(m, "max_abs_logit")]
        assert float(row["max_attention_logit"]) == max(logits)
        if read_json(run_dir / "summary.json")["status"] == "completed":
            assert with_entropy[-1]["step"] == 20  # the diagnostics of the last step
    assert 2 in checked_layers, "no multi-layer run: the mean over layers went untested"


def test_markdown_has_each_run_in_its_row_and_column(sweep_dir):
    text = (sweep_dir / "report" / "summary.md").read_text()
    header, body = markdown_table(text)
    columns = {int(cell.removeprefix("d_k=")): i for i, cell in enumerate(header) if i}
    rows = csv_rows(sweep_dir)
    for run_dir in run_dirs(sweep_dir):
        summary, row = read_json(run_dir / "summary.json"), rows[run_dir.name]
        column = columns[int(row["d_k"])]
        policy_rows = [r for r in body if r[0].split(" ")[0] == row["policy"]]
        assert policy_rows, f"no row for {row['policy']}"
        if summary["status"] == "completed":
            # Alone in its cell (n=1): runs of other learning rates are not averaged in.
            want = f"{summary['final_val_bpb']:.3f} (n=1)"
        else:
            want = f"diverged@{summary['diverged_at_step']}"
        assert any(r[column] == want for r in policy_rows), (want, policy_rows)
    # Four different runs, four rows: nothing averaged across learning rates or depths.
    assert len(body) == len(GRIDS["report"])


def test_plots_are_png_files(sweep_dir):
    for name in PLOTS:
        data = (sweep_dir / "report" / name).read_bytes()
        assert data[:8] == PNG_SIGNATURE, name
        _length, kind, width, height = struct.unpack(">I4sII", data[8:24])
        assert kind == b"IHDR" and width > 100 and height > 100, name
        assert data[-8:-4] == b"IEND", name  # complete, not truncated
    # One d_k with an LR grid: the plot against d_k would be loss_vs_lr's minima again.
    assert not (sweep_dir / "report" / "final_bpb_vs_dk.png").exists()


def test_wandb_table_holds_the_csv(sweep_dir):
    (run_dir,) = wandb_offline.find_run_dirs(sweep_dir / "report")
    tables = [row["summary"] for row in wandb_offline.read_history(run_dir) if "summary" in row]
    assert len(tables) == 1 and tables[0]["_type"] == "table-file"
    table = read_json(run_dir / "files" / tables[0]["path"])
    with open(sweep_dir / "report" / "summary.csv", newline="") as f:
        header, *csv_body = list(csv.reader(f))
    assert table["columns"] == header
    assert len(table["data"]) == len(csv_body)
    for logged, written in zip(table["data"], csv_body, strict=True):
        for value, text in zip(logged, written, strict=True):
            if value is None:
                assert text == ""
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                assert float(text) == value
            else:
                assert str(value) == text
    # The report's plots, as images of the summary run, byte for byte what report/ holds.
    images = {key: value for row in wandb_offline.read_history(run_dir)
              for key, value in row.items() if key.startswith("plots/")}
    pngs = sorted(p for p in (sweep_dir / "report").iterdir() if p.suffix == ".png")
    assert pngs and sorted(images) == [f"plots/{p.stem}" for p in pngs]
    for png in pngs:
        logged = images[f"plots/{png.stem}"]
        assert logged["_type"] == "image-file"
        assert (run_dir / "files" / logged["path"]).read_bytes() == png.read_bytes()
    # The summary run sits in the sweep's group, named after the sweep.
    run = wandb_offline.read_run(run_dir)
    member = read_json(next(sweep_dir.glob("*/config.json")))
    assert run["name"] == f"{sweep_dir.name}-report" and run["job_type"] == "report"
    assert run["group"] == member["wandb"]["group"]


# --------------------------------------------------------------------------- LR sensitivity


def row(policy, lr, final, *, status="completed", d_k=64, init=5.5, seed=0):
    return {
        "policy": policy,
        "d_k": d_k,
        "lr": lr,
        "seed": seed,
        "status": status,
        "final_val_loss": final,
        "initial_val_loss": init,
        "final_val_bpb": None,
        "diverged_at_step": 7 if status == "diverged" else None,
    }


def test_lr_sensitivity_is_wortsman_et_al_by_hand():
    rows = [
        # inv_sqrt_dk, d_k 64: two seeds at lr 1e-3, one at 1e-2, a diverged lr, a run worse
        # than initialisation.
        row("inv_sqrt_dk", 1e-3, 3.0),
        row("inv_sqrt_dk", 1e-3, 3.2, seed=1),
        row("inv_sqrt_dk", 1e-2, 2.5),
        row("inv_sqrt_dk", 1e-1, None, status="diverged"),
        row("inv_sqrt_dk", 1.0, 6.0),
        # none, d_k 32 (another grid, so not cut to inv_sqrt_dk's): every lr trains; the
        # initial loss is the mean over the runs' own.
        row("none", 1e-3, 4.0, init=5.4, d_k=32),
        row("none", 1e-2, 3.0, init=5.6, d_k=32),
        # One learning rate only: no sensitivity. No initial loss: none either.
        row("inv_dk", 1e-3, 3.0),
        row("qk_layernorm", 1e-3, 3.0, init=None, d_k=32),
        row("qk_layernorm", 1e-2, 2.0, init=None, d_k=32),
    ]
    # E_lr[min(loss(lr), loss_init)] − min_lr loss(lr), each lr's loss the mean over its seeds.
    per_lr = [(3.0 + 3.2) / 2, 2.5, 5.5, 5.5]
    want_inv_sqrt = sum(per_lr) / 4 - 2.5
    want_none = (4.0 + 3.0) / 2 - 3.0
    got = report.lr_sensitivity(rows)
    assert set(got) == {"inv_sqrt_dk d_k=64", "none d_k=32"}
    assert got["inv_sqrt_dk d_k=64"] == pytest.approx(want_inv_sqrt, abs=1e-12)  # 1.65
    assert got["none d_k=32"] == pytest.approx(want_none, abs=1e-12)


def test_lr_sensitivity_compares_settings_over_the_lrs_they_share():
    """A refinement adds LRs near each setting's own best; the mean over the grid counts only
    the LRs every setting at the d_k ran, per seed as well as over seeds."""
    base = [(1e-3, 3.0, 3.4), (1e-2, 2.0, 2.6), (1e-1, 4.0, 3.0)]  # lr, inv_sqrt_dk, none
    rows = [row(policy, lr, final, seed=seed)
            for lr, a, b in base for policy, final in (("inv_sqrt_dk", a), ("none", b))
            for seed in (0, 1)]
    rows += [row("inv_sqrt_dk", 5e-3, 1.0, seed=seed) for seed in (0, 1)]  # its refinement
    rows += [row("none", 3e-2, 2.5, seed=seed) for seed in (0, 1)]
    want = {"inv_sqrt_dk d_k=64": (3.0 + 2.0 + 4.0) / 3 - 2.0,
            "none d_k=64": (3.4 + 2.6 + 3.0) / 3 - 2.6}
    assert report.lr_sensitivity(rows) == pytest.approx(want)
    by_seed = comparisons.lr_sensitivity_by_seed(rows)
    assert by_seed[("none", 64)] == pytest.approx({0: want["none d_k=64"], 1: want["none d_k=64"]})


def test_lr_sensitivity_keeps_d_k_and_other_settings_apart():
    rows = [
        row("inv_sqrt_dk", lr, final, d_k=d_k)
        for d_k, lr, final in [
            (16, 1e-3, 3.0),
            (16, 1e-2, 2.0),
            (64, 1e-3, 4.0),
            (64, 1e-2, 5.0),
            (64, 1e-3, 3.5),
            (64, 1e-2, 3.0),
        ]
    ]
    # The last two d_k=64 runs had another init gain: a separate group, as a sweep would say.
    for r, gain in zip(rows, (1.0, 1.0, 1.0, 1.0, 2.0, 2.0), strict=True):
        r["override:model.init_gain"] = gain
    got = report.lr_sensitivity(rows)
    want = [(3.0 + 2.0) / 2 - 2.0, (4.0 + 5.0) / 2 - 4.0, (3.5 + 3.0) / 2 - 3.0]
    assert sorted(got.values()) == pytest.approx(sorted(want))


def test_an_lr_sweep_reports_its_sensitivity(sweep_dir):
    runs = [
        d for d in run_dirs(sweep_dir) if read_json(d / "config.json")["policy"] == "inv_sqrt_dk"
    ]
    assert len(runs) == 2
    initial = [next(m["val/loss"] for m in metrics_rows(d) if m["step"] == 0) for d in runs]
    loss_init = statistics.fmean(initial)
    finals = [min(read_json(d / "summary.json")["final_val_loss"], loss_init) for d in runs]
    want = statistics.fmean(finals) - min(finals)
    text = (sweep_dir / "report" / "summary.md").read_text()
    match = re.search(r"^\| inv_sqrt_dk d_k=16 \| ([0-9.]+) \|$", text, re.MULTILINE)
    assert match and float(match.group(1)) == pytest.approx(want, abs=5e-5)


# --------------------------------------------------------------------------- the CLI


def run_report(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "scale_ablation.report", *args],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_on_a_missing_directory_exits_2_with_one_line(tmp_path):
    missing = tmp_path / "no_such_sweep"
    result = run_report(str(missing))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and str(missing) in lines[0]
    assert result.stdout == "" and not missing.exists()


def test_cli_on_a_directory_without_runs_exits_2_and_writes_nothing(tmp_path):
    result = run_report(str(tmp_path))
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_cli_rewrites_the_same_report(sweep_dir, tmp_path):
    copy = tmp_path / sweep_dir.name
    shutil.copytree(sweep_dir, copy, ignore=shutil.ignore_patterns("report"))
    result = run_report(str(copy))
    assert result.returncode == 0, result.stderr
    written = (copy / "report" / "summary.md").read_text()
    assert written == (sweep_dir / "report" / "summary.md").read_text()
    assert written.strip() in result.stdout
    csv_text = (copy / "report" / "summary.csv").read_text()
    assert csv_text == (sweep_dir / "report" / "summary.csv").read_text()


def test_cli_refuses_a_reference_policy_without_runs(sweep_dir, tmp_path):
    copy = tmp_path / sweep_dir.name
    shutil.copytree(sweep_dir, copy, ignore=shutil.ignore_patterns("report"))
    result = run_report(str(copy), "--reference=qk_layernorm")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "qk_layernorm" in lines[0]
    assert not (copy / "report").exists()
    # A reference the sweep ran (one seed: no noise floor to measure) is the one named.
    result = run_report(str(copy), "--reference=learned")
    assert result.returncode == 0, result.stderr
    assert "Noise floor: not measured (no setting of the reference policy learned" in result.stdout


def test_lr_sensitivity_not_computed_is_said_when_grids_are_disjoint():
    """Each policy on its own grid (dk_sweep, mqar): no shared grid, no metric, and the summary
    says why instead of dropping the section."""
    rows = [row("inv_sqrt_dk", lr, 3.0) for lr in (1e-3, 3e-3)]
    rows += [row("none", lr, 3.0) for lr in (1e-4, 3e-4)]
    assert report.lr_sensitivity(rows) == {}
    assert "Not computed" in "\n".join(tables.sensitivity_tables(rows, "inv_sqrt_dk"))


def test_grid_table_lists_each_setting_in_first_seen_order_with_its_lrs_ascending():
    """A refined sweep's added LRs are run last; the table still reads them in LR order."""
    lrs = {"inv_sqrt_dk": (1e-2, 1e-3, 3e-2, 5.6e-3), "none": (3e-3, 1e-4, 1e-3)}
    rows = [dict(row(p, lr, 3.0), **{"override:train.lr": lr, "final_val_bpb": 4.0})
            for p in lrs for lr in lrs[p]]
    lines = tables.grid_table(rows, "final_val_bpb", "t")
    listed = [(m[1], float(m[2])) for line in lines
              if (m := re.match(r"\| (\S+) \(lr=([\d.e-]+)\)", line))]
    assert listed == [(p, lr) for p in lrs for lr in sorted(lrs[p])]


def test_noise_floor_says_when_the_study_has_no_reference_runs():
    rows = [dict(row("qk_rmsnorm", lr, 3.0, seed=s), final_val_bpb=4.0 + s / 10)
            for lr in (1e-3, 3e-3) for s in (0, 1)]
    assert "has no runs of the reference policy inv_sqrt_dk" in " ".join(
        tables.noise_floor_lines(rows, "inv_sqrt_dk", "final_val_bpb"))
    rows += [dict(r, policy="inv_sqrt_dk") for r in rows]  # now it has: a floor is measured
    assert "seed-to-seed std of inv_sqrt_dk" in " ".join(
        tables.noise_floor_lines(rows, "inv_sqrt_dk", "final_val_bpb"))
