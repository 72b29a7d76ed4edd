"""The report's first lines warn of runs that read their training data more than once, as their
summary.json records it (passes_over_data); runs written here with the project's RunFiles."""

from __future__ import annotations

import math

from experiments import base
from scale_ablation import report
from scale_ablation.records.run_files import RunFiles

# Run name -> passes over the data: seven repeat it (one named only in the count), one reads
# less than a pass, one (generated data) has no size.
PASSES = {"run_a": 20.4, "run_b": 1.02, "run_c": 3.5, "run_d": 0.3, "run_e": 34.0,
          "run_f": 2.25, "run_g": 1.5, "run_h": 7.0, "run_i": None}


def write_run(sweep, name: str, passes: float | None, seed: int, status="completed") -> None:
    config = base.get_config("quick").to_dict()
    config["train"]["seed"] = seed
    config["wandb"]["mode"] = "disabled"
    files = RunFiles(sweep / name)
    files.write_config(config)
    final = 2.5 + 0.01 * seed
    for step in (0, 30, 60):
        loss = final + 2.0 * math.exp(-step / 20)
        files.append_metrics(step, {"train/loss": loss, "val/loss": loss,
                                    "val/bpb": loss / math.log(2)})
    files.write_summary({"status": status, "steps_completed": 60, "final_val_loss": final,
                         "final_val_bpb": final / math.log(2), "diverged_at_step": None,
                         "passes_over_data": passes})


def test_runs_that_repeat_their_data_are_named_in_the_first_lines(tmp_path):
    sweep = tmp_path / "sweep"
    for seed, (name, passes) in enumerate(PASSES.items()):
        write_run(sweep, name, passes, seed)
    write_run(sweep, "run_failed", 0.5, len(PASSES), status="failed")
    out = report.write_report(str(sweep))
    lines = (sweep / "report" / "summary.md").read_text().splitlines()
    assert out == str(sweep / "report")
    warnings = [i for i, line in enumerate(lines) if "more than once" in line]
    assert len(warnings) == 1
    line = lines[warnings[0]]
    assert warnings[0] <= 2  # right after the noise-floor line
    repeated = sorted(((p, n) for n, p in PASSES.items() if p is not None and p > 1),
                      reverse=True)
    assert f"{len(repeated)} run(s)" in line
    assert f"up to {max(p for p, _ in repeated):.1f} passes" in line
    for passes, name in repeated[:report.NAMED_RUNS]:
        assert f"{name} ({passes:.1f})" in line
    for _, name in repeated[report.NAMED_RUNS:]:
        assert name not in line
    assert f"and {len(repeated) - report.NAMED_RUNS} more" in line
    assert "run_d" not in line and "run_i" not in line
    # Then the runs without a result, as before.
    notice = next(i for i, text in enumerate(lines) if "without a result" in text)
    assert notice > warnings[0] and "- run_failed: failed" in lines[notice:notice + 4]


def test_no_warning_when_every_run_reads_less_than_a_pass(tmp_path):
    sweep = tmp_path / "sweep"
    for seed, passes in enumerate((0.3, 0.99, None)):
        write_run(sweep, f"run{seed}", passes, seed)
    report.write_report(str(sweep))
    text = (sweep / "report" / "summary.md").read_text()
    assert "more than once" not in text
