"""The report's length-generalisation section and claim on a synthetic sweep with known answers.

Two policies × 3 LRs × 4 seeds, written with the project's own RunFiles: the final bits per
byte at n is best at LR 3e-3 for both; each run's bits per byte beyond n at L = 2n and 4n is its
value at n plus a known degradation, larger for the reference (inv_sqrt_dk) than for log_length
and growing with L. A seed effect shared by both policies makes paired intervals narrow.
The expected cells and paired differences are computed here with scipy from those numbers.
"""

from __future__ import annotations

import json
import math
import pathlib

import pytest
from scipy import stats as sps

from experiments import base
from scale_ablation import report
from scale_ablation.analysis import claims, verdicts
from scale_ablation.analysis import comparisons as cmp
from scale_ablation.analysis import tables as report_tables
from scale_ablation.records.run_files import RunFiles

LRS, SEEDS, LENGTHS = (1e-3, 3e-3, 1e-2), (0, 1, 2, 3), (128, 256)
SEED_EFFECT = (0.04, -0.03, 0.01, -0.02)
DEGRADATION = {"inv_sqrt_dk": 0.30, "log_length": 0.12}  # at 2n; doubled at 4n
OWN_NOISE = {"inv_sqrt_dk": (0, 0, 0, 0), "log_length": (0.004, -0.002, 0.001, -0.003)}


def bpb_at_n(policy: str, lr: float, seed: int) -> float:
    x = math.log10(lr / 3e-3)
    return 2.9 + 0.2 * x * x + SEED_EFFECT[seed] + (0.01 if policy == "log_length" else 0)


def degradation(policy: str, lr: float, seed: int, length: int) -> float:
    """Worse away from the best LR, so a comparison at the wrong LR would give other numbers."""
    grows = length // LENGTHS[0]
    return (grows * DEGRADATION[policy] + 0.05 * abs(math.log10(lr / 3e-3))
            + SEED_EFFECT[seed] / 2 + OWN_NOISE[policy][seed])


def degradation_on_test(policy: str, lr: float, seed: int, length: int) -> float:
    """On the test split: the validation value plus a policy-dependent shift, so that a number
    read from the wrong split shows."""
    return degradation(policy, lr, seed, length) + (0.2 if policy == "log_length" else 0.05)


def write_run(sweep: pathlib.Path, policy: str, lr: float, seed: int,
              test: bool = False) -> tuple[str, dict]:
    overrides = {"policy": policy, "train.lr": lr, "train.seed": seed}
    name = f"policy={policy},lr={lr},seed={seed}"
    config = base.get_config("quick").to_dict()
    config["policy"] = policy
    config["train"].update(lr=lr, seed=seed, eval_seq_lens=list(LENGTHS))
    config["wandb"]["mode"] = "disabled"
    files = RunFiles(sweep / name)
    files.write_config(config)
    bpb = bpb_at_n(policy, lr, seed)
    row = {"val/bpb": bpb, "val/loss": bpb * math.log(2)}
    for length in LENGTHS:
        beyond = bpb + degradation(policy, lr, seed, length)
        row.update({f"val/bpb@{length}": (bpb + beyond) / 2, f"val/bpb_beyond@{length}": beyond,
                    f"val/loss_beyond@{length}": beyond * math.log(2),
                    f"val/bpb_degradation@{length}": beyond - bpb})
    if test:  # the test split at n is 0.01 above validation; beyond n as test_degradation
        row.update({"test/bpb": bpb + 0.01, "test/loss": (bpb + 0.01) * math.log(2)})
        for length in LENGTHS:
            shift = degradation_on_test(policy, lr, seed, length)
            row.update({f"test/bpb_beyond@{length}": bpb + 0.01 + shift,
                        f"test/bpb_degradation@{length}": shift})
    files.append_metrics(0, {"val/loss": 5.5, "val/bpb": 5.5 / math.log(2)})
    files.append_metrics(60, row)
    files.write_summary({"status": "completed", "steps_completed": 60, "diverged_at_step": None,
                         "final_val_bpb": bpb, "final_val_loss": bpb * math.log(2),
                         **({"test_bpb": bpb + 0.01} if test else {})})
    return name, overrides


def sweep_rows(sweep: pathlib.Path, test: bool = False) -> list[dict]:
    runs = [write_run(sweep, policy, lr, seed, test)
            for policy in DEGRADATION for lr in LRS for seed in SEEDS]
    (sweep / "sweep.json").write_text(json.dumps(
        {"runs": [{"name": name, "overrides": overrides} for name, overrides in runs]}))
    return [report.summarise_run(run) for run in report.load_runs(str(sweep))]


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> list[dict]:
    return sweep_rows(tmp_path_factory.mktemp("length"))


def scipy_cell(values: list[float], digits: int = 3) -> str:
    mean, sem = sum(values) / len(values), sps.sem(values)
    half = sps.t.ppf(0.975, len(values) - 1) * sem
    return f"{mean:.{digits}f} ± {half:.{digits}f} (n={len(values)})"


@pytest.fixture(scope="module")
def markdown(rows, tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("md") / "summary.md"
    report_tables.write_markdown(rows, str(path))
    return path.read_text()


def table_rows(markdown: str, heading: str) -> list[list[str]]:
    section = markdown.split(heading, 1)[1].split("\n## ", 1)[0]
    return [[c.strip() for c in line.strip("|").split("|")] for line in section.splitlines()
            if line.startswith("| ") and not line.startswith("| policy")]


def test_each_variant_gets_bpb_at_n_beyond_n_and_the_degradation(markdown):
    found = table_rows(markdown, "## Length generalisation")
    assert len(found) == len(DEGRADATION) * len(LRS)
    for policy in DEGRADATION:
        for lr in LRS:
            expected = [scipy_cell([bpb_at_n(policy, lr, s) for s in SEEDS])]
            for length in LENGTHS:
                expected += [
                    scipy_cell([bpb_at_n(policy, lr, s) + degradation(policy, lr, s, length)
                                for s in SEEDS]),
                    scipy_cell([degradation(policy, lr, s, length) for s in SEEDS])]
            name = policy + f" (lr={lr})"
            assert [r[2:] for r in found if r[0] == name] == [expected], name


def test_degradation_is_paired_by_seed_at_each_best_lr(markdown):
    for length in LENGTHS:
        found = table_rows(markdown, f"## Degradation beyond n at L={length} against inv_sqrt_dk")
        differences = [degradation("log_length", 3e-3, s, length)
                       - degradation("inv_sqrt_dk", 3e-3, s, length) for s in SEEDS]
        assert found == [["log_length", "32", scipy_cell(differences, 4), "better"]]


def test_beyond_n_keys_stay_out_of_the_generic_tables(markdown):
    assert "# Final val/bpb@128" in markdown  # the whole longer sequence keeps its table
    assert "# Final val/bpb_beyond" not in markdown
    assert "# Final val/bpb_degradation" not in markdown


def test_the_claim_on_the_degradation_metric(rows):
    rule = claims.Compare("better", policies=("log_length",),
                          metric=f"final_val/bpb_degradation@{LENGTHS[-1]}")
    verdict = verdicts.judge(claims.Claim("log-length degrades less", rule), rows)
    assert verdict.verdict == "supported", verdict
    worse = claims.Compare("worse", policies=("log_length",),
                           metric=f"final_val/bpb_degradation@{LENGTHS[-1]}")
    assert verdicts.judge(claims.Claim("x", worse), rows).verdict == "contradicted"


def test_no_section_without_longer_lengths(rows):
    plain = [{k: v for k, v in r.items() if "@" not in k} for r in rows]
    assert report_tables.length_tables(plain, cmp.best_lrs(plain, "final_val_bpb", False),
                                       "inv_sqrt_dk") == []


def test_the_test_split_reports_where_every_run_scored_it(tmp_path):
    """Runs that scored the longer lengths on the test split: the table and the paired
    differences read those (validation still chose the LR: 3e-3 for both), and the claim says
    which split it was measured on."""
    rows = sweep_rows(tmp_path, test=True)
    path = tmp_path / "summary.md"
    report_tables.write_markdown(rows, str(path))
    text = path.read_text()
    assert "of test sequences of length L" in text
    found = table_rows(text, "## Length generalisation")
    name = "inv_sqrt_dk (lr=0.003)"
    (cells,) = [r[2:] for r in found if r[0] == name]
    assert cells[0] == scipy_cell([bpb_at_n("inv_sqrt_dk", 3e-3, s) + 0.01 for s in SEEDS])
    assert cells[2] == scipy_cell([degradation_on_test("inv_sqrt_dk", 3e-3, s, LENGTHS[0])
                                   for s in SEEDS])
    differences = [degradation_on_test("log_length", 3e-3, s, LENGTHS[-1])
                   - degradation_on_test("inv_sqrt_dk", 3e-3, s, LENGTHS[-1]) for s in SEEDS]
    paired = table_rows(text, f"## Degradation beyond n at L={LENGTHS[-1]} against inv_sqrt_dk")
    assert paired == [["log_length", "32", scipy_cell(differences, 4), "better"]]
    rule = claims.Compare("better", policies=("log_length",),
                          metric=f"final_val/bpb_degradation@{LENGTHS[-1]}")
    verdict = verdicts.judge(claims.Claim("log-length degrades less", rule), rows)
    assert verdict.verdict == "supported" and "on the test split" in " ".join(verdict.numbers)


def test_length_cells_only_where_a_variant_ran_and_no_pairs_across_d_k():
    """log_length ran at d_k 16 only, the reference at 32 only: a row per (variant, d_k) that
    ran, and no paired table (no seed of the reference shares a d_k with log_length)."""
    def run(policy, d_k, seed, at_n, beyond):
        return {"policy": policy, "d_k": d_k, "lr": 3e-3, "seed": seed, "status": "completed",
                "final_val_bpb": at_n, "final_val/bpb_beyond@128": beyond,
                "final_val/bpb_degradation@128": beyond - at_n}

    rows = [run("log_length", 16, 0, 2.9, 3.1), run("log_length", 16, 1, 3.0, 3.3),
            run("inv_sqrt_dk", 32, 0, 2.8, 3.2), run("inv_sqrt_dk", 32, 1, 2.9, 3.2)]
    lines = report_tables.length_tables(rows, [], "inv_sqrt_dk")
    body = [line for line in lines if line.startswith("| ") and "---" not in line][1:]
    assert [line.split(" | ")[:2] for line in body] == [["| log_length", "16"],
                                                         ["| inv_sqrt_dk", "32"]]
    half = sps.t.ppf(0.975, 1) * sps.tstd([0.2, 0.3]) / math.sqrt(2)  # Δ of log_length's seeds
    assert f"0.250 ± {half:.3f} (n=2)" in body[0]
    assert not any("against inv_sqrt_dk" in line for line in lines)
