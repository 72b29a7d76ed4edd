r"""Review a sweep: `python -m scale_ablation.report DIR [--reference=POLICY]` writes DIR/report/.

summary.csv (one row per run), summary.md (`report_tables`: the noise floor, a warning naming
the runs that read their training data more than once, the runs without a result, then tables of
mean ± 95% CI (n) over seeds headed by baselines, best LR per setting, paired differences against
the reference policy, unstable runs, LR sensitivity), PNG plots (`report_plots`) and, when the
experiment file declares `claims(arg)`, claims.md (`claims`). Every number comes from the runs'
own metrics.jsonl and summary.json; spikes and collapse are found from the metrics when
summary.json does not record them. The table is also logged as a wandb.Table to a summary run in
the sweep's group. The folder is built beside DIR/report/ and swapped in by one rename
(`records.staging`): a report killed or refused half way (a damaged refined.json) leaves the
previous one as it was.
`--imports=my_policy.py` imports user modules first, as the sweep did (`scale_ablation.model.plugins`);
without it, the report imports what the sweep recorded in sweep.json.
"""

from __future__ import annotations

import os
import re
import sys

from absl import flags

from scale_ablation import command_line
from scale_ablation.analysis import baselines, consumption, failures, scale_predictor
from scale_ablation.analysis import comparisons as cmp
from scale_ablation.analysis import plots as report_plots
from scale_ablation.analysis import tables as report_tables
from scale_ablation.analysis.claims_markdown import write_claims
from scale_ablation.analysis.comparisons import lr_sensitivity  # noqa: F401 - part of the report's API
from scale_ablation.model import plugins
from scale_ablation.records import (
    intervention_rows,
    locking,
    staging,
    study_store,
    wandb_workspace,
)
from scale_ablation.records import metrics_rows as rm
from scale_ablation.records.run_files import FINISHED
from scale_ablation.records.summary_csv import write_summary_csv
from scale_ablation.records.wandb_tracker import WandbSettings, WandbTracker, resolve_wandb_mode
from scale_ablation.sweeping import run_set
from scale_ablation.training import experiment_files as experiment


def load_runs(sweep_dir: str) -> list[dict]:
    """Each run of the sweep: name, overrides, config, summary and metrics, from its study
    store (a published study's runs.parquet) or its run directories (`study_store`)."""
    return study_store.load_runs(sweep_dir)


def _baselines(config: dict) -> dict[str, float]:
    try:
        return {f"baseline_{k}": v for k, v in baselines.baselines(config).items()}
    except (ValueError, KeyError, OSError):  # the data is not readable here: no baseline
        return {}


def _failures(run: dict, found: dict[str, float]) -> dict:
    """The failure taxonomy (`analysis.failures`) applied to the run's rows by today's rules, so
    that every run of a report is judged alike; summary.json's fields keep what the training
    loop found, by the rules of its day, on the same rows. Spikes alone are taken from the
    summary when it says they were judged on every step's loss (`failures.judged_spike_step`;
    the rows hold every log_every-th step only); older runs' are judged on the rows."""
    def nats(key: str) -> float | None:
        return None if found.get(key) is None else baselines.bits_to_nats(found[key])
    warmup = run["config"]["train"].get("warmup_steps", 0)
    steps = failures.failure_steps(run["metrics"], warmup_steps=warmup,
                                   unigram_loss=nats("baseline_unigram_bpb"),
                                   summary=run["summary"])
    kinds = failures.classify(run["metrics"], warmup_steps=warmup,
                              unigram_loss=nats("baseline_unigram_bpb"),
                              bigram_loss=nats("baseline_bigram_bpb"),
                              status=run["summary"].get("status"), summary=run["summary"])
    return {**steps, "failures": ";".join(kinds)}


def _val_bpb_at(metrics: list[dict], step: int) -> float | None:
    """Validation bits per byte of the evaluation at `step` (None if the run made none there)."""
    return next((r["val/bpb"] for r in metrics
                 if r.get("step") == step and r.get("val/bpb") is not None), None)


def _at_step_0(metrics: list[dict]) -> dict:
    """The attention before any update (the diagnostics pass at step 0): the lowest layer's
    normalised entropy and the largest layer's logit std; None for runs that logged none."""
    row = next((r for r in metrics if r.get("step") == 0
                and rm.layer_values(r, "entropy_normalised")), {})
    entropies = rm.layer_values(row, "entropy_normalised")
    return {"initial_entropy_normalised": min(entropies.values()) if entropies else None,
            "initial_logit_std": rm.layer_max(row, "logit_std")}


def _d_k(config: dict) -> int:
    """The q/k width per head: `model.qk_dim` when it is set apart, else the head dim."""
    return config["model"].get("qk_dim") or config["model"]["head_dim"]


def summarise_run(run: dict) -> dict:
    metrics, summary, config = run["metrics"], run["summary"], run["config"]
    diag_rows = [r for r in metrics if rm.layer_mean(r, "entropy") is not None]
    last_diag = diag_rows[-1] if diag_rows else {}
    max_logits = rm.max_over_training(metrics, "max_abs_logit")
    last_eval = next((r for r in reversed(metrics) if r.get("val/loss") is not None), {})
    test_row = next((r for r in reversed(metrics) if r.get("test/loss") is not None), {})
    found = _baselines(config)
    return {
        "name": run["name"],
        "policy": config["policy"],
        "d_k": _d_k(config),
        "lr": config["train"]["lr"],
        "seed": config["train"]["seed"],
        "task": "mqar" if config["data"]["source"] == "mqar" else "lm",
        **{f"override:{k}": v for k, v in run["overrides"].items()},
        "status": summary.get("status"),
        "steps_completed": summary.get("steps_completed"),
        "final_val_bpb": summary.get("final_val_bpb"),
        "final_val_loss": summary.get("final_val_loss"),
        # The disjoint test split, scored once at the end (None for runs made before it).
        "final_test_bpb": summary.get("test_bpb"),
        **({"final_test/accuracy": summary["test_accuracy"]}
           if summary.get("test_accuracy") is not None else {}),
        "diverged_at_step": summary.get("diverged_at_step"),
        **_failures(run, found),
        # What the run consumed (absent from runs recorded before these fields existed).
        **{field: summary.get(field) for field in ("parameters", "non_embedding_parameters",
                                                   "tokens_seen", "passes_over_data",
                                                   "train_flops")},
        "final_entropy": rm.layer_mean(last_diag, "entropy"),
        "final_entropy_normalised": rm.layer_mean(last_diag, "entropy_normalised"),
        "final_max_weight": rm.layer_mean(last_diag, "max_weight"),
        "final_logit_std": rm.layer_mean(last_diag, "logit_std"),  # the article's 0.8-1.2 band
        "final_learned_scale": rm.layer_mean(last_diag, "learned_scale"),
        "max_attention_logit": max(max_logits.values()) if max_logits else None,
        **{f"max_attention_logit/layer{i}": v for i, v in sorted(max_logits.items())},
        **intervention_rows.acted_fields(metrics, summary),  # did it act? (`analysis.acted`)
        **scale_predictor.row_fields(last_diag),  # the logits' sources (issue 53)
        **_at_step_0(metrics),  # decided at init? (`analysis.at_init`)
        "initial_val_loss": next((r["val/loss"] for r in metrics
                                  if r.get("step") == 0 and r.get("val/loss") is not None), None),
        # An early budget (analysis/exponent.py's ExponentShift): the evaluation halfway through.
        "val_bpb_at_half_steps": _val_bpb_at(metrics, config["train"]["steps"] // 2),
        **found,
        # Accuracy (MQAR recall) and the longer evaluation lengths, from the last evaluation.
        **{f"final_{key}": value for key, value in last_eval.items()
           if key.startswith("val/") and key not in ("val/loss", "val/bpb")},
        # The longer lengths on the test split (`comparisons.report_metric` reports them).
        **{f"final_{key}": value for key, value in test_row.items()
           if key.startswith("test/") and "@" in key},
    }


def load_claims(spec: str) -> list:
    """The claims the experiment file of `spec` declares (none if it declares none, or if the
    file is not where the sweep ran it from)."""
    try:
        module, arg = experiment.load_module(spec)
    except ValueError:
        return []
    return list(module.claims(arg)) if hasattr(module, "claims") else []


def _sweep_record(sweep_dir: str) -> dict:
    return study_store.study_json(sweep_dir, study_store.SWEEP_FILE) or {}


def _experiment_spec(sweep_dir: str) -> str | None:
    return _sweep_record(sweep_dir).get("config")


def sweep_imports(sweep_dir: str) -> list[str]:
    """The `--imports` the sweep's runs had (sweep.json; none for sweeps written before)."""
    return _sweep_record(sweep_dir).get("imports") or []


def write_report(sweep_dir: str, reference: str | None = None, workspace: bool = False,
                 plots: bool = True) -> str:
    """Write sweep_dir/report/ and return its path. `reference`: the policy others are paired
    against (default inv_sqrt_dk); one named explicitly must have runs in the sweep. `plots`:
    False writes the tables and claims only (what a check of them needs, at a fraction of the
    time)."""
    if os.path.isfile(os.path.join(sweep_dir, "config.json")):
        raise ValueError(f"{sweep_dir} is a run directory (it has a config.json), not a sweep: "
                         "give the folder that holds the sweep's run directories")
    found = run_set.of(sweep_dir)  # before anything is written: damaged records refuse here
    runs = load_runs(sweep_dir) + run_set.read_unrecorded(found)
    if not runs:
        raise ValueError(f"no runs with a config.json under {sweep_dir}")
    rows = [summarise_run(run) for run in runs]
    if reference is not None and reference not in {r["policy"] for r in rows}:
        raise ValueError(f"reference policy {reference!r} has no runs under {sweep_dir}")
    reference = reference or cmp.DEFAULT_REFERENCE
    out = os.path.join(sweep_dir, "report")
    # Built beside `out` and swapped in whole (`records.staging`): a kill or an error half way
    # (a damaged refined.json, a full disk) leaves the previous report as it was.
    with staging.staged(out) as building:
        staging.copy_into(out, building, WANDB_STATE)  # the summary run keeps its W&B id
        _write_files(sweep_dir, building, found, runs, rows, reference, plots)
    if workspace:  # after the summary run, whose table and images the view shows
        print(write_workspace(sweep_dir, runs, rows))
    return out


# What the report's W&B summary run keeps from one report to the next (`_log_to_wandb`).
WANDB_STATE = ("wandb_run_id.txt", "wandb")


def _write_files(sweep_dir: str, out: str, found: run_set.RunSet, runs: list[dict],
                 rows: list[dict], reference: str, plots: bool) -> None:
    """The report's files into the folder `out`, and its W&B summary run."""
    header = write_summary_csv(rows, os.path.join(out, "summary.csv"))
    report_tables.write_markdown(rows, os.path.join(out, "summary.md"), reference)
    # Each paragraph goes right after the noise floor: the last inserted reads first.
    _insert_after_noise_floor(os.path.join(out, "summary.md"),
                              consumption.lines([run["summary"] for run in runs]))
    write_incomplete_notice(os.path.join(out, "summary.md"), found)
    warning = repeated_data_warning(rows)
    if warning:  # inserted last, so it comes first, right after the noise floor
        _insert_after_noise_floor(os.path.join(out, "summary.md"), warning)
    if plots:
        report_plots.write_plots(runs, rows, out)
    spec = _experiment_spec(sweep_dir)
    if spec is not None:
        # The runs without files count in their claims' arms as runs without a result.
        write_claims(load_claims(spec), spec, sweep_dir, rows + absent_rows(found, spec),
                     os.path.join(out, "claims.md"),
                     run_count=(found.finished, len(found.statuses)))
    _log_to_wandb(sweep_dir, runs, header, rows, out)


def absent_rows(found: run_set.RunSet, spec: str) -> list[dict]:
    """A row per run of the set with no config.json here, from its grid point (policy, d_k,
    LR, seed, overrides) and its status: what the verdicts need to count it in its claim's
    arms. None when the experiment file cannot be read here (the run set names them anyway)."""
    try:
        base = experiment.load_config(spec)
    except ValueError:
        return []
    out = []
    for name, (status, overrides) in found.absent().items():
        try:
            config = experiment.apply_overrides(base, overrides).to_dict()
        except ValueError:  # a point the experiment no longer has: listed, not counted
            continue
        out.append({"name": name, "policy": config["policy"], "d_k": _d_k(config),
                    "lr": config["train"]["lr"], "seed": config["train"]["seed"],
                    "task": "mqar" if config["data"]["source"] == "mqar" else "lm",
                    **{f"override:{k}": v for k, v in overrides.items()}, "status": status})
    return out


def incomplete_runs(sweep_dir: str) -> list[tuple[str, str]]:
    """(name, status) of the sweep's runs without a result: failed (refused ones included),
    interrupted, preempted, missing (in the grid, never started) or damaged (`run_set`)."""
    return [(name, status) for name, status in run_set.of(sweep_dir).statuses.items()
            if status not in FINISHED]


def write_incomplete_notice(path: str, found: run_set.RunSet) -> None:
    """Put the runs without a result, those with damaged files and the names outside the run
    set at the top of the markdown report, after the noise-floor line: the tables below leave
    them out, and a reader must not take them for the whole grid."""
    if lines := found.notice():
        _insert_after_noise_floor(path, lines)


NAMED_RUNS = 5  # a warning names this many runs, then counts the rest


def repeated_data_warning(rows: list[dict]) -> list[str]:
    """One line when runs read their training split more than once (summary.json's
    passes_over_data > 1): their final loss measures memorisation too. Empty otherwise."""
    repeated = sorted(((row["passes_over_data"], row["name"]) for row in rows
                       if (row.get("passes_over_data") or 0) > 1), reverse=True)
    if not repeated:
        return []
    names = ", ".join(f"{name} ({passes:.1f})" for passes, name in repeated[:NAMED_RUNS])
    more = len(repeated) - NAMED_RUNS
    return [f"**Warning: {len(repeated)} run(s) read their training data more than once "
            f"(up to {repeated[0][0]:.1f} passes), so their final validation loss measures "
            f"memorisation too: {names}{f' and {more} more' if more > 0 else ''}.**"]


def _insert_after_noise_floor(path: str, lines: list[str]) -> None:
    """`lines` as a paragraph at the top of the markdown report, after the noise-floor line."""
    with open(path, encoding="utf-8") as f:
        body = f.read()
    head, rest = ("", body)
    if body.startswith("Noise floor"):
        first, _, rest = body.partition("\n\n")
        head = first + "\n\n"
    with open(path, "w", encoding="utf-8") as f:
        f.write(head + "\n".join(lines) + "\n\n" + rest)


def _log_to_wandb(sweep_dir: str, runs: list[dict], header: list[str], rows: list[dict],
                  out: str) -> None:
    settings = WandbSettings.of(
        runs[0]["config"].get("wandb"), job_type="report", tags=(),
        name=f"{os.path.basename(os.path.normpath(sweep_dir))}-report")
    writer = WandbTracker(out, {"sweep_dir": os.path.abspath(sweep_dir)}, settings,
                          one_offline_folder=True)
    writer.log_table("summary", header, [[row.get(k) for k in header] for row in rows])
    writer.log_images({f"plots/{name.removesuffix('.png')}": os.path.join(out, name)
                       for name in sorted(os.listdir(out)) if name.endswith(".png")})
    writer.finish()


_IMPORTS = plugins.imports_flag()


def write_workspace(sweep_dir: str, runs: list[dict], rows: list[dict]) -> str:
    """`--wandb_workspace`: the study's W&B view (`wandb_workspace`), saved when online, its
    specification beside the report in every mode. Returns the line saying where it is."""
    settings = WandbSettings.of(runs[0]["config"].get("wandb"))
    out = os.path.join(sweep_dir, "report")
    key, higher = cmp.primary_metric(rows)
    with open(os.path.join(out, "summary.md"), encoding="utf-8") as f:
        markdown = f.read()
    view = wandb_workspace.StudyView(
        entity=settings.entity, project=settings.project,
        group=settings.group or os.path.basename(os.path.normpath(sweep_dir)),
        name=f"{os.path.basename(os.path.normpath(sweep_dir))} study",
        history_metric="val/accuracy" if higher else "val/bpb", final_metric=key,
        layers=tuple(sorted({int(k.rsplit("layer", 1)[1]) for r in rows for k in r
                             if k.startswith("max_attention_logit/layer")})),
        images=tuple(f"plots/{name.removesuffix('.png')}" for name in sorted(os.listdir(out))
                     if name.endswith(".png")),
        markdown=markdown)
    return wandb_workspace.write(view, out, online=resolve_wandb_mode(settings.mode) == "online")


USAGE = ("python -m scale_ablation.report [--imports=MODULE_OR_FILE,...] SWEEP_DIR "
         "[--reference=POLICY] [--wandb_workspace]")


def main(argv: list[str], reference: str | None = None, workspace: bool = False,
         partial: bool = False) -> int:
    if len(argv) != 2:
        print(f"usage: {USAGE}", file=sys.stderr)
        return 2
    if not os.path.isdir(argv[1]):
        print(f"error: no such sweep directory: {argv[1]}", file=sys.stderr)
        return 2
    if not partial and (busy := sweep_in_progress(argv[1])):
        print(f"error: {busy}", file=sys.stderr)
        return 2
    try:
        # The sweep's policies, as its runs had them: --imports, else what sweep.json recorded.
        plugins.load(_IMPORTS.value or sweep_imports(argv[1]))
        out = write_report(argv[1], reference, workspace)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    with open(os.path.join(out, "summary.md")) as f:
        print(f.read())
    # The verdicts last, where a reader of a long table finds them (the main job's closing lines).
    print("\n".join(verdict_lines(out)))
    count = run_set.of(argv[1]).count_line()
    print(f"{count}: " * bool(count) + f"report written to {out}")
    return 0


def sweep_in_progress(sweep_dir: str) -> str | None:
    """One line saying that a sweep holds `sweep_dir` (None: none does): its runs are still
    training, and a report or publish of it now would judge part of them as if that were all."""
    holder = locking.holder(sweep_dir)
    if holder is None:
        return None
    return (f"a sweep is writing {sweep_dir} ({holder}): its runs are not all finished; wait "
            "for it to end, or give --partial for a report on the runs finished so far")


def verdict_lines(out: str) -> list[str]:
    """'N. claim: Verdict: **word**' for each claim in `out`/claims.md (none: no claims file)."""
    path = os.path.join(out, "claims.md")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        text = f.read()
    return [f"{title}: {verdict}" for title, verdict in re.findall(
        r"^## (\d+\. .*?)\n.*?^(Verdict.*?\*\*\w+\*\*)", text, re.M | re.S)]


if __name__ == "__main__":
    # Defined here, not at import: `sweep` imports this module and has flags of its own.
    flags.DEFINE_string("reference", None, "Policy the others are paired against "
                        f"(default {cmp.DEFAULT_REFERENCE}).")
    flags.DEFINE_bool("wandb_workspace", False, "Also build the study's W&B workspace (runs "
                      "grouped by policy; needs the `workspace` extra): saved when online, its "
                      "specification written to report/wandb_workspace.json in every mode.")
    flags.DEFINE_bool("partial", False, "Report a sweep still running (one holding the "
                      "directory's lock) on the runs finished so far.")
    command_line.start(lambda argv: main(argv, flags.FLAGS.reference,
                                         flags.FLAGS.wandb_workspace, flags.FLAGS.partial),
                       positionals=1, usage=USAGE)
