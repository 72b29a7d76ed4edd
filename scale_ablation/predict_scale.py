r"""c* of the c·d_k^(-1/2) family from one run at c = 1 per d_k, tested against a study's measured
c* (issue 53, item 5; the rule: `analysis/scale_predictor.py`).

  python -m scale_ablation.predict_scale runs/scale_predictor_cpu \
      --measured=experiments/results/dk_exponent_cpu [--out=prediction.md]

RUNS is a sweep (or published study) of runs at c = 1 (1/√d_k) that logged the logits' sources
(`model.logit_sources`; experiments/scale_predictor.py); STUDY one that swept c at the same
model (experiments/dk_exponent.py), whose c* per d_k and 95% intervals `analysis/exponent.py`
locates. Prints, per init, where the logits at c = 1 came from at the end of training (the
initial weights' part, the updates'), the update's share over training, the predicted and the
measured c* per d_k with the rule's verdict, and the hypothesis read off STUDY itself: the
post-scale std at its measured c* per d_k.
"""

from __future__ import annotations

import os
import sys

from absl import flags

from scale_ablation import command_line, report
from scale_ablation.analysis import exponent
from scale_ablation.analysis import scale_predictor as sp
from scale_ablation.records import metrics_rows as rm

USAGE = "python -m scale_ablation.predict_scale RUNS --measured=STUDY [--out=FILE]"
LOW_C = 0.25  # the exploratory two-run predictor's second c


def _rows(study_dir: str) -> tuple[list[dict], list[dict]]:
    """(report rows, loaded runs) of a sweep directory or a published study."""
    if not os.path.isdir(study_dir):
        raise ValueError(f"{study_dir}: no such directory")
    runs = report.load_runs(study_dir)
    if not runs:
        raise ValueError(f"{study_dir}: no runs")
    return [report.summarise_run(run) for run in runs], runs


def _sources_table(rows: list[dict], init: str) -> list[str]:
    """Where the c = 1 runs' final logits came from, per d_k (means over layers)."""
    stats = {stat: sp.at_c(rows, init, f"final_{stat}") for stat in
             ("qk_std", "qk_std_init", "qk_std_update", "qk_std_scaled")}
    lines = ["| d_k | post-scale std σ₁ | pre-scale q·k std | q₀·k₀ (initial weights) | "
             "q·k − q₀·k₀ (updates) | updates / q·k |", "|---|---|---|---|---|---|"]
    for d_k, whole in stats["qk_std"].items():
        init_part, update = stats["qk_std_init"][d_k], stats["qk_std_update"][d_k]
        lines.append(f"| {d_k} | {stats['qk_std_scaled'][d_k]:.3g} | {whole:.3g} | "
                     f"{init_part:.3g} | {update:.3g} | {update / whole:.2f} |")
    return lines


def _shares(metrics: list[dict]) -> dict[int, float]:
    """step -> the updates' share of q·k's std (means over layers) at each diagnostics row."""
    out = {}
    for row in metrics:
        whole, update = rm.layer_mean(row, "qk_std"), rm.layer_mean(row, "qk_std_update")
        if whole:
            out[row["step"]] = update / whole
    return out


def _over_training(rows: list[dict], runs: list[dict], init: str) -> list[str]:
    """The updates' share of q·k's std at each diagnostics step, per d_k (one run each)."""
    mine = sorted((row["d_k"], _shares(run["metrics"])) for row, run in zip(rows, runs,
                                                                           strict=True)
                  if exponent.init_of(row) == init)
    steps = sorted({step for _, shares in mine for step in shares})
    lines = ["| d_k | " + " | ".join(f"step {s}" for s in steps) + " |",
             "|---|" + "---|" * len(steps)]
    for d_k, shares in mine:
        lines.append(f"| {d_k} | " + " | ".join(f"{shares.get(s, float('nan')):.2f}"
                                                for s in steps) + " |")
    return lines


def _two_runs(rows: list[dict], measured: list[dict], init: str) -> list[str]:
    """The exploratory two-run predictor, from the measured study's own runs at c = 1/4 and
    c = 1 (the LR and seed of RUNS' run; the post-scale std they logged, `final_logit_std`)."""
    lr, seed = next((float(r["lr"]), r["seed"]) for r in exponent.init_rows(rows, init))
    key = "final_logit_std"
    sigma1 = sp.at_c(measured, init, 1.0, key, lr=lr, seed=seed)
    e = sp.elasticities(measured, init, LOW_C, key, lr=lr, seed=seed)
    if not e:
        return []
    found = sp.compare(sigma1, exponent.fit(measured, init).optima, init, elasticity=e)
    return ["", f"### Exploratory, after the test: two runs, c = {LOW_C:g} and c = 1", "",
            f"The same rule with the post-scale std at c taken as σ₁·c^e, e per d_k the slope of "
            f"log std on log c between c = {LOW_C:g} and c = 1 (the measured study's runs at LR "
            f"{lr:g}, seed {seed}, and their `{key}`, the per-head std averaged over heads and "
            f"layers; those runs are among the ones that located c*). e per d_k: "
            + ", ".join(f"{d} {v:.2f}" for d, v in e.items()) + ".", "",
            *_comparison(found, "The two-run predictor")]


def _comparison(found: sp.Comparison, name: str = "The predictor") -> list[str]:
    lines = ["| d_k | σ₁ | implied target T(d_k) | predicted c* (leave one out) | "
             "predicted c* (in sample) | measured c* [95%] | inside |",
             "|---|---|---|---|---|---|---|"]
    for r in found.rows:
        lines.append(f"| {r.d_k} | {r.sigma1:.3g} | {r.implied:.3g} | {r.predicted:.3g} | "
                     f"{r.predicted_in_sample:.3g} | {r.star:.3g} [{r.ci[0]:.3g}, "
                     f"{r.ci[1]:.3g}] | {'yes' if r.inside else 'no'} |")
    inside = sum(r.inside for r in found.rows)
    slopes = found.slopes
    lines += ["", f"Target T (median of the implied targets): {found.target:.3g}; the implied "
              f"targets span ×{found.target_spread:.2f}. Predicted c* inside the measured "
              f"interval at {inside} of {len(found.rows)} d_k; Spearman ρ(predicted, measured) "
              f"= {found.rank_correlation:+.2f}. Slope of log c* on log d_k: predicted "
              f"{slopes[0]:+.3f}, measured {slopes[1]:+.3f}.", "",
              f"**{name} {'holds' if found.holds else 'fails'}** ({found.init} init): "
              "it holds if every predicted c* (leave one out) lies inside the measured 95% "
              "interval and ρ > 0."]
    return lines


def _at_optimum(rows: list[dict], init: str) -> list[str]:
    """The post-scale std at the measured c* per d_k, read off the study that swept c."""
    # The logit sources' std where every run logged them; a study whose later passes logged
    # them and earlier ones did not (dk_exponent_cpu's third) is read on final_logit_std alone.
    mine = [r for r in rows if exponent.init_of(r) == init]
    key = (sp.SCALED if mine and all(r.get(sp.SCALED) is not None for r in mine)
           else "final_logit_std")
    fit = exponent.fit(rows, init)
    lines = [f"Post-scale std (`{key}`) at the measured c*, interpolated in log c between its "
             "grid's c (each at its best LR; the interval from c*'s draws):", ""]
    for d_k, found in sorted(fit.optima.items()):
        at = sp.std_at_optimum(rows, init, found, d_k, key)
        if at is not None:
            lines.append(f"- d_k {d_k}: c* {found.star:.3g}, std {at[0]:.3g} "
                         f"[{at[1][0]:.3g}, {at[1][1]:.3g}]")
    return lines


def write(runs_dir: str, measured_dir: str) -> str:
    """The markdown the command prints."""
    rows, runs = _rows(runs_dir)
    measured, _ = _rows(measured_dir)
    inits = sorted({exponent.init_of(r) for r in rows})
    out = ["# c* predicted from one run at c = 1 per d_k", "",
           f"Runs at c = 1: `{runs_dir}` ({len(rows)}); measured c*: `{measured_dir}` "
           "(analysis/exponent.py). The rule and the target: analysis/scale_predictor.py."]
    for init in inits:
        sigma1 = sp.at_c(rows, init)
        if not sigma1:
            raise ValueError(f"{runs_dir}: no {init} run at c = 1 logged final_qk_std_scaled")
        found = sp.compare(sigma1, exponent.fit(measured, init).optima, init)
        out += ["", f"## {init}", "", "Where the logits came from at the end of training "
                "(c = 1; stds over every visible (batch, head, query, key), mean over layers):",
                "", *_sources_table(rows, init), "", "The updates' share of q·k's std over "
                "training:", "", *_over_training(rows, runs, init), "", *_comparison(found), "",
                *_at_optimum(measured, init), *_two_runs(rows, measured, init)]
    return "\n".join(out) + "\n"


def main(argv: list[str], measured: str | None = None, out: str | None = None) -> int:
    if not measured:
        print(f"error: --measured is needed (usage: {USAGE})", file=sys.stderr)
        return 2
    try:
        text = write(argv[1], measured)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if out:
        with open(out, "w", encoding="utf-8") as f:
            f.write(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    # Flags defined only when run, as the other commands that share a process in the tests.
    flags.DEFINE_string("measured", None, "A study that swept c: its located c* per d_k.")
    flags.DEFINE_string("out", None, "Also write the markdown here.")
    command_line.start(lambda argv: main(argv, flags.FLAGS.measured, flags.FLAGS.out),
                       positionals=1, usage=USAGE)
