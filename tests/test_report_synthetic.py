"""The report on a synthetic sweep with known answers, checked against scipy and numpy.

Four policies × a 5-point log LR grid × 4 seeds, written with the project's own RunFiles:
- inv_sqrt_dk (the reference): a U-shaped final loss against LR, best at 1e-2; one seed
  diverges at the largest LR.
- none: the reference's curve plus a true gap of GAP nats (and a little noise of its own);
  at lr 3e-2 seed 1 the training loss spikes; at lr 1e-1 every seed collapses to the unigram loss.
- inv_dk: the reference's curve plus zero-mean noise: no true gap.
- qk_layernorm: loss falling with LR, best at the grid's largest LR (edge warning); its
  attention logits stay small while the others' grow with LR; one run failed.
A seed effect shared by every policy makes unpaired intervals wide and paired ones narrow.
"""

from __future__ import annotations

import json
import math
import pathlib
import re
import statistics

import numpy as np
import pytest
from scipy import stats as sps

from experiments import base
from scale_ablation import report
from scale_ablation.analysis import baselines
from scale_ablation.records.run_files import RunFiles

LRS = (1e-3, 3e-3, 1e-2, 3e-2, 1e-1)
SEEDS = (0, 1, 2, 3)
POLICIES = ("inv_sqrt_dk", "none", "inv_dk", "qk_layernorm")
GAP = 0.05  # nats: none − inv_sqrt_dk at every LR
SEED_EFFECT = (0.03, -0.02, 0.01, -0.015)
OWN_NOISE = {"inv_sqrt_dk": (0, 0, 0, 0), "none": (0.002, -0.001, 0.001, -0.002),
             "inv_dk": (0.01, -0.01, 0.005, -0.005), "qk_layernorm": (0.003, -0.003, 0.0, 0.001)}
STEPS, INIT_LOSS, WARMUP = 100, 5.5, 10
DIVERGED = ("inv_sqrt_dk", 1e-1, 3)
FAILED = ("qk_layernorm", 1e-3, 3)
SPIKED = ("none", 3e-2, 1)
SPIKE_AT = 60

EXPERIMENT = '''
from scale_ablation.analysis import claims as c

def get_config(arg=None):
    return None

def claims(arg=None):
    return [
        c.Claim("none is worse", c.Compare("worse", policies=("none",))),
        c.Claim("inv_dk is worse", c.Compare("worse", policies=("inv_dk",))),
        c.Claim("qk_layernorm is worse", c.Compare("worse", policies=("qk_layernorm",))),
        c.Claim("qk logits stay small", c.Compare("better", policies=("qk_layernorm",),
                metric="max_attention_logit", at="each_lr", min_lr=0.05, log10=True)),
        c.Claim("none never trains smoothly", c.Unstable(("none",))),
        c.Claim("inv_sqrt_dk trains smoothly", c.Unstable(("inv_sqrt_dk",), False)),
    ]
'''
VERDICTS = ["supported", "inconclusive", "contradicted", "supported", "contradicted", "supported"]


def config_for(policy: str, lr: float, seed: int) -> dict:
    config = base.get_config("quick").to_dict()
    config["policy"] = policy
    config["model"]["head_dim"] = 64
    config["train"].update(lr=lr, seed=seed, steps=STEPS, warmup_steps=WARMUP)
    config["wandb"]["mode"] = "disabled"
    return config


def unigram_loss() -> float:
    return baselines.baselines(config_for("none", 1e-3, 0))["unigram_bpb"] * math.log(2)


def final_loss(policy: str, lr: float, seed: int) -> float:
    """The known final validation loss (nats) of a completed run."""
    x = math.log10(lr) + 2  # 0 at lr 1e-2
    reference = 2.6 + 0.1 * x * x
    shape = {"inv_sqrt_dk": reference, "none": reference + GAP, "inv_dk": reference,
             "qk_layernorm": 2.55 - 0.05 * (math.log10(lr) + 1)}[policy]
    if policy == "none" and lr == 1e-1:
        return 1.02 * unigram_loss() + SEED_EFFECT[seed]
    return shape + SEED_EFFECT[seed] + OWN_NOISE[policy][seed]


def max_logit(policy: str, lr: float, seed: int, step: int) -> float:
    if policy == "qk_layernorm":
        return 3.0 + 0.1 * seed
    return 5.0 + 0.5 * seed + 1000 * lr * step / STEPS


def write_run(sweep: pathlib.Path, policy: str, lr: float, seed: int) -> dict:
    overrides = {"policy": policy, "train.lr": lr, "train.seed": seed}
    name = f"policy={policy},lr={lr},seed={seed}"
    files = RunFiles(sweep / name)
    files.write_config(config_for(policy, lr, seed))
    case = (policy, lr, seed)
    last = 30 if case == DIVERGED else 50 if case == FAILED else STEPS
    final = final_loss(policy, lr, seed)
    collapsing = policy == "none" and lr == 1e-1
    for step in range(0, last + 1, 10):
        row = {"train/loss": final + (INIT_LOSS - final) * math.exp(-step / 20) + 0.01}
        if case == SPIKED and step == SPIKE_AT:
            row["train/loss"] = 2 * final
        if step % 20 == 0:
            val = final + (INIT_LOSS - final) * math.exp(-step / 20)
            if collapsing and step > 0:
                val = 3.0 if step == 20 else final  # learned, then fell back to the unigram
            row.update({"val/loss": val, "val/bpb": val / math.log(2)})
        if step % 50 == 0:
            row.update({f"attn/layer{i}/max_abs_logit": max_logit(policy, lr, seed, step)
                        for i in (0, 1)})
        files.append_metrics(step, row)
    if case == DIVERGED:
        files.append_metrics(31, {"train/loss": math.nan})
        summary = {"status": "diverged", "steps_completed": 31, "diverged_at_step": 31}
    elif case == FAILED:
        summary = {"status": "failed", "steps_completed": 50}
    else:
        summary = {"status": "completed", "steps_completed": STEPS, "final_val_loss": final,
                   "final_val_bpb": final / math.log(2)}
    files.write_summary({"final_val_loss": None, "final_val_bpb": None,
                         "diverged_at_step": None, **summary})
    return {"name": name, "overrides": overrides, "status": summary["status"]}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("synthetic")
    (root / "claims_experiment.py").write_text(EXPERIMENT)
    sweep = root / "sweep"
    runs = [write_run(sweep, p, lr, s) for p in POLICIES for lr in LRS for s in SEEDS]
    (sweep / "sweep.json").write_text(json.dumps(
        {"config": str(root / "claims_experiment.py"), "runs": runs}))
    report.write_report(str(sweep))
    return sweep


# --------------------------------------------------------------------------- reading the report


def section(text: str, heading: str) -> list[list[str]]:
    """Body rows of the first table after the line `heading`."""
    lines = text.splitlines()
    start = lines.index(heading)
    first = next(i for i in range(start, len(lines)) if lines[i].startswith("|"))
    rows = []
    for line in lines[first + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def summary_md(sweep: pathlib.Path) -> str:
    return (sweep / "report" / "summary.md").read_text()


def completed(policy: str, lr: float) -> list[float]:
    return [final_loss(policy, lr, s) / math.log(2) for s in SEEDS
            if (policy, lr, s) not in (DIVERGED, FAILED)]


def scipy_cell(values: list[float], digits: int = 3) -> str:
    mean = float(np.mean(values))
    if len(values) < 2:
        return f"{mean:.{digits}f} (n=1)"
    low, high = sps.t.interval(0.95, len(values) - 1, loc=mean, scale=sps.sem(values))
    return f"{mean:.{digits}f} ± {(high - low) / 2:.{digits}f} (n={len(values)})"


def best_lr(policy: str) -> float:
    eligible = [lr for lr in LRS if len(completed(policy, lr)) == len(SEEDS)]
    return min(eligible, key=lambda lr: np.mean(completed(policy, lr)))


# --------------------------------------------------------------------------- the checks


def test_first_lines_give_the_noise_floor(sweep):
    first = summary_md(sweep).splitlines()[0]
    stds = [np.std(completed("inv_sqrt_dk", lr), ddof=1) for lr in LRS]
    assert first.startswith("Noise floor:")
    assert f"is {statistics.median(stds):.4f} (median over {len(LRS)} groups" in first


def test_every_grid_cell_is_mean_ci_n_with_its_marks(sweep):
    rows = {r[0]: r[1] for r in section(summary_md(sweep), "# Final validation bits per byte")}
    assert len(rows) == len(POLICIES) * len(LRS)
    for policy in POLICIES:
        for lr in LRS:
            cell = rows[f"{policy} (lr={lr})"]
            assert cell.startswith(scipy_cell(completed(policy, lr))), (policy, lr, cell)
            if (policy, lr) == DIVERGED[:2]:
                assert cell.endswith("diverged@31")
            if (policy, lr) == FAILED[:2]:
                assert cell.endswith("[failed]")
            if (policy, lr) == SPIKED[:2]:
                assert cell.endswith(f"spiked@{SPIKE_AT}")
            if policy == "none" and lr == 1e-1:
                assert cell.endswith("collapsed@40,40,40,40")
            if not any((policy, lr) == case[:2] for case in (DIVERGED, FAILED, SPIKED)) and not (
                    policy == "none" and lr == 1e-1):
                assert cell == scipy_cell(completed(policy, lr))


def test_max_logit_table_is_the_seed_mean_of_each_runs_largest_logit(sweep):
    """Largest over both layers and every logged step, then mean ± CI over completed seeds."""
    title = "# Largest |attention logit| during training (max over layers)"
    rows = {r[0]: r[1] for r in section(summary_md(sweep), title)}
    assert len(rows) == len(POLICIES) * len(LRS)
    for policy in POLICIES:
        for lr in LRS:
            largest = [max(max_logit(policy, lr, s, step) for step in range(0, STEPS + 1, 50))
                       for s in SEEDS if (policy, lr, s) not in (DIVERGED, FAILED)]
            mean, _, half_width, n = rows[f"{policy} (lr={lr})"].split()[:4]
            expected = scipy_cell(largest, digits=6).split()
            # One decimal printed: compare numbers, not strings (3.15 may round either way).
            np.testing.assert_allclose([float(mean), float(half_width)],
                                       [float(expected[0]), float(expected[2])], atol=0.05 + 1e-9)
            assert n == expected[3], (policy, lr)


def test_baselines_head_the_table(sweep):
    text = summary_md(sweep)
    counts = baselines.baselines(config_for("none", 1e-3, 0))
    head = text.split("# Final validation bits per byte", 1)[1].split("| policy", 1)[0]
    assert f"unigram {counts['unigram_bpb']:.3f}" in head
    assert f"bigram {counts['bigram_bpb']:.3f}" in head


def polyfit_vertex(policy: str) -> float:
    """The LR at the vertex of numpy's quadratic through the seed means (bits per byte) at the
    best LR and its two neighbours, against log10(lr)."""
    i = LRS.index(best_lr(policy))
    x = [math.log10(lr) for lr in LRS[i - 1:i + 2]]
    a, b, _ = np.polyfit(x, [np.mean(completed(policy, lr)) for lr in LRS[i - 1:i + 2]], 2)
    return 10 ** (-b / (2 * a))


def test_best_lr_per_policy_and_the_edge_warning(sweep):
    rows = {r[0]: r for r in section(summary_md(sweep), "## Best learning rate per setting")}
    assert set(rows) == set(POLICIES)
    for policy in POLICIES:
        _, d_k, located, lr, bracket, grid, final, unstable, note = rows[policy]
        assert float(lr) == best_lr(policy) and d_k == "64"
        assert final == scipy_cell(completed(policy, best_lr(policy)))
        assert grid == f"{LRS[0]:.3g}–{LRS[-1]:.3g} (5)"
        assert ("grid edge" in note) == (policy == "qk_layernorm")
        assert unstable == "none"
        if policy == "qk_layernorm":  # best at the largest LR: the optimum is only a bound
            assert (located, bracket) == (f"≥ {LRS[-1]:.3g}", "edge")
            assert note.endswith("waiting on LR 0.001")  # its failed run is rerun by the sweep
            continue
        # Each seed's curve is the same parabola shifted by its seed effect (up to the
        # rounding of the summary's values): the interval is that point within a few percent.
        vertex = polyfit_vertex(policy)
        point, low, high = re.fullmatch(r"(\S+) \((\S+)–(\S+)\)", located).groups()
        assert point == f"{vertex:.3g}", policy
        shown = float(point)  # the cells are rounded to 3 significant digits alike
        assert float(low) <= shown <= float(high) and float(high) / float(low) < 1.1, located
        i = LRS.index(best_lr(policy))
        assert bracket == f"×{max(LRS[i] / LRS[i - 1], LRS[i + 1] / LRS[i]):.3g}"
        assert "coarser than ×√2" in note
    assert best_lr("qk_layernorm") == LRS[-1] and best_lr("inv_sqrt_dk") == 1e-2
    assert "WARNING: best LR on the edge of the grid" in summary_md(sweep)


def scipy_paired(values: list[float], reference: list[float], unit: str = "") -> str:
    interval = sps.ttest_rel(values, reference).confidence_interval(0.95)
    mean = float(np.mean(np.subtract(values, reference)))
    return f"{mean:.4f} ± {(interval.high - interval.low) / 2:.4f}{unit} (n={len(values)})"


def test_paired_differences_at_each_best_lr(sweep):
    title = "## Paired differences against inv_sqrt_dk, each at its own best LR"
    rows = {r[0]: r for r in section(summary_md(sweep), title)}
    reference = [final_loss("inv_sqrt_dk", best_lr("inv_sqrt_dk"), s) / math.log(2) for s in SEEDS]
    want = {"none": "worse", "inv_dk": "unresolved", "qk_layernorm": "better"}
    for policy, decision in want.items():
        lr = best_lr(policy)
        seeds = [s for s in SEEDS if (policy, lr, s) != FAILED]
        values = [final_loss(policy, lr, s) / math.log(2) for s in seeds]
        _, d_k, diff, verdict = rows[policy]
        assert d_k == "64"
        assert diff == scipy_paired(values, [reference[s] for s in seeds])
        assert verdict == decision
    # The true gap of `none`, in bits, lies inside its interval.
    mean, half = map(float, re.match(r"(\S+) ± (\S+)", rows["none"][2]).groups())
    assert abs(mean - GAP / math.log(2)) <= half


def test_pairing_is_what_resolves_the_gap(sweep):
    # Unpaired, the seed effect hides the 0.072-bit gap of `none`: the intervals overlap.
    none, ref = completed("none", 1e-2), completed("inv_sqrt_dk", 1e-2)
    low_none = sps.t.interval(0.95, 3, loc=np.mean(none), scale=sps.sem(none))[0]
    high_ref = sps.t.interval(0.95, 3, loc=np.mean(ref), scale=sps.sem(ref))[1]
    assert low_none < high_ref


def test_paired_differences_at_the_same_lr(sweep):
    title = "## Paired differences against inv_sqrt_dk at the same LR"
    rows = {(r[0], float(r[2])): r for r in section(summary_md(sweep), title)}
    assert len(rows) == 3 * len(LRS)
    for policy in ("none", "inv_dk", "qk_layernorm"):
        for lr in LRS:
            seeds = [s for s in SEEDS if (policy, lr, s) != FAILED
                     and ("inv_sqrt_dk", lr, s) != DIVERGED]
            values = [final_loss(policy, lr, s) / math.log(2) for s in seeds]
            reference = [final_loss("inv_sqrt_dk", lr, s) / math.log(2) for s in seeds]
            assert rows[(policy, lr)][3] == scipy_paired(values, reference), (policy, lr)
            if policy == "none" and lr < 1e-1:
                assert rows[(policy, lr)][4] == "worse"
            if policy == "inv_dk":
                assert rows[(policy, lr)][4] == "unresolved"


def test_failed_runs_table(sweep):
    rows = {r[0]: r for r in section(summary_md(sweep), "## Runs with a failure kind")}
    diverged = f"policy={DIVERGED[0]},lr={DIVERGED[1]},seed={DIVERGED[2]}"
    spiked = f"policy={SPIKED[0]},lr={SPIKED[1]},seed={SPIKED[2]}"
    collapsed = {f"policy=none,lr=0.1,seed={s}" for s in SEEDS}
    assert {diverged, spiked, *collapsed} <= set(rows)
    assert rows[diverged][1] == "diverged" and rows[diverged][3] == "31"
    assert "spiked" in rows[spiked][2] and rows[spiked][4] == str(SPIKE_AT)
    assert rows[spiked][6] == "—"
    for name in collapsed:
        assert "collapsed" in rows[name][2].split(", ") and rows[name][6] == "40"
    others = set(rows) - {diverged, spiked, *collapsed}
    assert all(rows[name][2] == "not_learning" for name in others), others


def sensitivity(policy: str, seed: int) -> float:
    """Wortsman et al. for one seed, by hand: diverged runs count as the initial loss, a failed
    run leaves its LR out of the seed's curve (and with it the whole seed)."""
    curve = []
    for lr in LRS:
        if (policy, lr, seed) == DIVERGED:
            curve.append(INIT_LOSS)
        else:
            curve.append(min(final_loss(policy, lr, seed), INIT_LOSS))
    return float(np.mean(curve) - np.min(curve))


def test_lr_sensitivity_per_seed_with_ci(sweep):
    title = "Per seed (each seed's own curve over the grid): mean ± 95% CI (n seeds)."
    rows = {r[0]: r[2] for r in section(summary_md(sweep), title)}
    for policy in POLICIES:
        seeds = [s for s in SEEDS if (policy, 1e-3, s) != FAILED]
        assert rows[policy] == scipy_cell([sensitivity(policy, s) for s in seeds], 4)


def test_claims_verdicts(sweep):
    """The synthetic runs end above the bigram line less 0.3 bits per byte, so the claims file
    says that this sweep cannot support a verdict, and only a decision against a claim stands."""
    text = (sweep / "report" / "claims.md").read_text()
    assert "**This sweep cannot support a verdict:**" in text and "no run learned" in text
    verdicts = re.findall(r"^Verdict \(.*?\): \*\*(\w+)\*\*", text, re.MULTILINE)
    assert len(verdicts) == len(VERDICTS) and set(verdicts) <= {"inconclusive", "contradicted"}
    assert "Command: `python -m scale_ablation.sweep --config=" in text
    # The numbers behind the first verdict are in the file.
    lr = best_lr("none")
    values = [final_loss("none", lr, s) / math.log(2) for s in SEEDS]
    reference = [final_loss("inv_sqrt_dk", lr, s) / math.log(2) for s in SEEDS]
    assert f"Δ = {scipy_paired(values, reference, ' bits per byte')} on the validation split" in text
    # Every synthetic run ends above the bigram line: by the taxonomy none trains smoothly.
    assert re.search(r"d_k=64: smooth at no LR; .*not learning of", text)


def test_csv_carries_instability_and_per_layer_logits(sweep):
    import csv

    with open(sweep / "report" / "summary.csv", newline="") as f:
        rows = {r["name"]: r for r in csv.DictReader(f)}
    spiked = rows[f"policy={SPIKED[0]},lr={SPIKED[1]},seed={SPIKED[2]}"]
    assert spiked["spike_step"] == str(SPIKE_AT) and spiked["collapse_step"] == ""
    run = rows["policy=none,lr=0.1,seed=2"]
    assert float(run["max_attention_logit/layer1"]) == max_logit("none", 0.1, 2, STEPS)


def test_plots_written(sweep):
    for name in ("val_loss_curves.png", "loss_vs_lr.png", "max_logit_over_training.png",
                 "max_logit_vs_lr_layer0.png", "max_logit_vs_lr_layer1.png"):
        assert (sweep / "report" / name).read_bytes()[:4] == b"\x89PNG", name
    # These runs log no attention entropy: no empty plot of it; and at one d_k with an LR grid
    # the plot against d_k would be loss_vs_lr's minima again.
    for name in ("entropy_over_training.png", "final_bpb_vs_dk.png"):
        assert not (sweep / "report" / name).exists(), name


# --------------------------------------------------------------------------- MQAR


def test_mqar_tables_use_accuracy_with_chance_and_context_guess(tmp_path):
    """Recall accuracy is the metric (higher is better) and its tables carry MQAR's baselines."""
    # Each policy's best LR is interior: a best on the grid's edge decides nothing.
    accuracy = {("inv_sqrt_dk", 1e-3): 0.50, ("inv_sqrt_dk", 3e-3): 0.80,
                ("inv_sqrt_dk", 1e-2): 0.60, ("none", 1e-3): 0.35, ("none", 3e-3): 0.40,
                ("none", 1e-2): 0.30}
    runs = []
    for (policy, lr), acc in accuracy.items():
        for seed in (0, 1, 2):
            config = config_for(policy, lr, seed)
            config["data"].update(source="mqar", mqar_num_pairs=4, mqar_vocab_size=32)
            name = f"policy={policy},lr={lr},seed={seed}"
            files = RunFiles(tmp_path / name)
            files.write_config(config)
            value = acc + 0.01 * seed
            files.append_metrics(STEPS, {"val/loss": 1.0, "val/bpb": 1.0 / math.log(2),
                                         "val/accuracy": value})
            files.write_summary({"status": "completed", "steps_completed": STEPS,
                                 "final_val_loss": 1.0, "final_val_bpb": 1.0 / math.log(2),
                                 "diverged_at_step": None})
            runs.append({"name": name, "overrides": {"policy": policy, "train.lr": lr,
                                                     "train.seed": seed}})
    (tmp_path / "sweep.json").write_text(json.dumps({"config": "none.py", "runs": runs}))
    report.write_report(str(tmp_path))
    text = (tmp_path / "report" / "summary.md").read_text()
    counts = baselines.baselines(config)
    head = text.split("# Final val/accuracy", 1)[1].split("| policy", 1)[0]
    assert f"chance {2 / 32:.3f}" in head
    assert f"guess a value seen in the context {counts['context_guess_accuracy']:.3f}" in head
    table = section(text, "## Best learning rate per setting")
    best = {r[0]: float(r[3]) for r in table}
    assert best == {"inv_sqrt_dk": 3e-3, "none": 3e-3}  # the highest accuracy, not the lowest
    for policy, *_, in table:  # located at the vertex of the accuracy's maximum
        x = [math.log10(lr) for lr in (1e-3, 3e-3, 1e-2)]
        a, b, _ = np.polyfit(x, [accuracy[(policy, lr)] + 0.01 for lr in (1e-3, 3e-3, 1e-2)], 2)
        assert a < 0 and next(r for r in table if r[0] == policy)[2].startswith(
            f"{10 ** (-b / (2 * a)):.3g} (")
    (row,) = section(text, "## Paired differences against inv_sqrt_dk, each at its own best LR")
    assert row[0] == "none" and row[3] == "worse"  # 0.40 against 0.80: lower accuracy


def test_a_rule_with_an_unknown_expectation_is_refused():
    from scale_ablation.analysis import claims

    with pytest.raises(ValueError, match="expect"):
        claims.Compare("smaller")
    with pytest.raises(ValueError, match="best_lr, each_lr or own_lr"):
        claims.Compare("worse", at="sometimes")
