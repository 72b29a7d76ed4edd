"""summary.md: the noise floor first, then tables whose cells read mean ± 95% CI (n) over seeds,
each language-model table headed by its count baselines (MQAR: chance and context guessing).

Runs evaluated at lengths L beyond the training length n (`train.eval_seq_lens`) get a length
section: bits per byte on positions n..L-1 only and the degradation from n, with the
degradation paired by seed against the reference.

Failed runs are marked in their cell: `diverged@STEP` (non-finite loss; no final value),
`spiked@STEP`, `entropy_collapsed@STEP` and `collapsed@STEP` (the failure taxonomy of
`failures.py`; their final values still count). The failed-runs table names every kind,
`not_learning` included.

The best-LR table gives each setting's located optimum (`optimum.curve_optima`: the vertex of a
parabola in log LR through the grid's best point and its neighbours, with located.py's CI over
seeds) beside the grid's best point, how finely the grid brackets it, and a note where the
optimum is only a bound (at the grid's edge) or not located.
"""

from __future__ import annotations

import math

from scale_ablation.analysis import comparisons as cmp
from scale_ablation.analysis import failures, intervals, optimum

BASELINE_KEYS = {
    "lm": (("baseline_unigram_bpb", "unigram"), ("baseline_bigram_bpb", "bigram")),
    "mqar": (("baseline_chance_accuracy", "chance"),
             ("baseline_context_guess_accuracy", "guess a value seen in the context")),
}


def _steps(rows: list[dict], key: str) -> str:
    return ",".join(str(r[key]) for r in rows if r.get(key) is not None)


def cell(rows: list[dict], key: str = "final_val_bpb", digits: int = 3) -> str:
    """`mean ± CI (n=k)` of the completed runs, then the instability and status marks."""
    found = cmp.estimate(rows, key)
    return " ".join(([found.format(digits)] if found else []) + marks(rows)) or "—"


def marks(rows: list[dict]) -> list[str]:
    """`diverged@STEPS`, `spiked@STEPS`, `collapsed@STEPS` and other statuses of `rows`."""
    parts = []
    for mark, step_key in (("diverged", "diverged_at_step"), ("spiked", "spike_step"),
                           ("entropy_collapsed", "entropy_collapse_step"),
                           ("collapsed", "collapse_step")):
        marked = [r for r in rows if r.get(step_key) is not None
                  and (mark == "diverged") == (r["status"] == "diverged")]
        if marked:
            parts.append(f"{mark}@{_steps(marked, step_key)}")
    others = [r["status"] for r in rows if r["status"] not in ("completed", "diverged")]
    if others:
        parts.append(f"[{', '.join(others)}]")
    return parts


def baseline_line(rows: list[dict], key: str) -> list[str]:
    """The baselines a table of `key` is read against, as one line (none for other metrics)."""
    task = "mqar" if key.startswith("final_val/accuracy") else "lm"
    if task == "lm" and key != "final_val_bpb":  # counted at data.seq_len windows only
        return []
    found = []
    for field, name in BASELINE_KEYS[task]:
        values = sorted({round(r[field], 4) for r in rows if r.get(field) is not None})
        if values:
            found.append(f"{name} {' / '.join(f'{v:.3f}' for v in values)}")
    if not found:
        return []
    if task == "lm":
        return [f"Baselines (bits per byte of the same validation bytes, counted on the training "
                f"split, add-k smoothing): {'; '.join(found)}.", ""]
    return [f"Baselines (recall accuracy): {'; '.join(found)}.", ""]


def by_setting_then_lr(rows: list[dict]) -> list[dict]:
    """`rows` with each setting's in first-seen order and its LRs ascending: a refined grid's
    added LRs come last in the runs, but a reader scans a setting's LRs in order."""
    first_seen = {name: i for i, name in enumerate(dict.fromkeys(map(cmp.setting, rows)))}
    return sorted(rows, key=lambda r: (first_seen[cmp.setting(r)], r.get("lr") or 0.0))


def grid_table(rows: list[dict], key: str, title: str, digits: int = 3) -> list[str]:
    groups: dict[str, dict[int, list[dict]]] = {}  # variant -> d_k -> rows
    for r in by_setting_then_lr(rows):
        groups.setdefault(cmp.variant(r), {}).setdefault(r["d_k"], []).append(r)
    head_dims = sorted({r["d_k"] for r in rows})
    lines = [f"# {title}", "", *baseline_line(rows, key),
             "| policy | " + " | ".join(f"d_k={d}" for d in head_dims) + " |",
             "|---|" + "---|" * len(head_dims)]
    for name, by_dk in groups.items():
        cells = [cell(by_dk.get(d, []), key, digits) for d in head_dims]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


PLUS_MINUS = ("Every a ± b here is a mean and the half-width of its 95% confidence interval "
              "(Student t over seeds; n: the runs it rests on), in the table's unit: bits per "
              "byte unless it says otherwise.")


def noise_floor_lines(rows: list[dict], reference: str, key: str) -> list[str]:
    floor = cmp.noise_floor(rows, reference, key)
    what = key.removeprefix("final_")
    if floor is None and not any(r["policy"] == reference for r in rows):
        return [f"Noise floor: not measured (the study has no runs of the reference policy "
                f"{reference}).", ""]
    if floor is None:
        return [f"Noise floor: not measured (no setting of the reference policy {reference} "
                f"has two or more completed seeds).", ""]
    seeds = (f"{min(floor.seeds)}" if min(floor.seeds) == max(floor.seeds)
             else f"{min(floor.seeds)}–{max(floor.seeds)}")
    if len(floor.stds) == 1:
        spread = f"one group of one LR and d_k, {seeds} completed seeds"
    else:
        spread = (f"median over {len(floor.stds)} groups of one LR and d_k; range "
                  f"{min(floor.stds):.4f}–{max(floor.stds):.4f}; {seeds} completed seeds each")
    return [f"Noise floor: the seed-to-seed std of {reference}'s {what} is "
            f"{floor.median:.4f} ({spread}). "
            "Differences smaller than this are not resolved by single runs.", ""]


def located(curve: optimum.CurveOptimum | None) -> tuple[str, str]:
    """(located LR with its 95% CI, the bracket) of a curve, as table cells."""
    found = curve.found if curve is not None else None
    if found is None:
        return "—", "—"
    if not found.interior:  # the optimum lies beyond the grid: a bound, not a location
        return (f"{'≤' if found.edge == 'low' else '≥'} {found.best_lr:.3g}", "edge")
    bracket = f"×{found.bracketed_at:.3g}"
    if not found.fitted:  # a neighbour failed: no parabola through it
        return f"{found.best_lr:.3g} (not fitted: a neighbour failed)", bracket
    ci = found.lr_ci
    low = f"< {found.lrs[0]:.3g}" if ci and ci[0] == 0 else f"{ci[0]:.3g}" if ci else ""
    high = f"> {found.lrs[-1]:.3g}" if ci and ci[1] == math.inf else f"{ci[1]:.3g}" if ci else ""
    interval = f"{low}–{high}" if ci else "no CI: 1 seed"
    return f"{found.lr_star:.3g} ({interval})", bracket


def _located_note(curve: optimum.CurveOptimum | None) -> str:
    if curve is None:
        return ""
    notes = [f"waiting on LR {', '.join(f'{lr:.3g}' for lr in curve.waiting)}"] \
        if curve.waiting else []
    if curve.found is None:
        notes.append(f"not located: {curve.reason}")
    elif curve.found.bracketed_at > optimum.TARGET_RATIO * (1 + 1e-4) and curve.found.interior:
        notes.append("coarser than ×√2 (`sweep --refine`)")
    return "; ".join(notes)


def best_lr_table(rows: list[dict], best: list[cmp.BestLR], key: str,
                  curves: list[optimum.CurveOptimum] = ()) -> list[str]:
    """Per setting: the located optimum and its CI (located.py: the best LR re-chosen in every
    draw), the grid's best LR beside it, the bracket (the larger ratio to the best point's
    neighbours) and the grid."""
    by_curve = {(c.setting, c.d_k): c for c in curves}
    lines = ["## Best learning rate per setting", "", *baseline_line(rows, key),
             "Located LR: the vertex of a parabola in log LR through the grid's best point and "
             "its neighbours (mean over seeds), 95% CI with the best LR re-chosen in every draw "
             "(scale_ablation/analysis/located.py; an end past the grid: < or > its edge); the "
             "runs exist at the grid's best.", "",
             "| policy | d_k | located LR (95% CI) | grid best LR | bracket | grid | "
             "final at grid best | unstable at grid best | note |",
             "|---|---|---|---|---|---|---|---|---|"]
    for b in best:
        curve = by_curve.get((b.setting, b.d_k))
        lr_star, bracket = located(curve)
        grid = f"{b.grid[0]:.3g}–{b.grid[-1]:.3g} ({len(b.grid)})"
        note = _located_note(curve)
        if b.lr is None:
            lines.append(f"| {b.setting} | {b.d_k} | {lr_star} | — | {bracket} | {grid} | — | — "
                         f"| {'; '.join(filter(None, ['no LR completed', note]))} |")
            continue
        note = "; ".join(filter(None, ["WARNING: best LR at the grid edge" if b.at_edge else "",
                                       note]))
        lines.append(f"| {b.setting} | {b.d_k} | {lr_star} | {b.lr:.3g} | {bracket} | {grid} "
                     f"| {b.estimate.format()} | {' '.join(marks(list(b.runs))) or 'none'} "
                     f"| {note} |")
    return lines


def edge_warnings(best: list[cmp.BestLR]) -> list[str]:
    edges = [f"{b.setting} at d_k={b.d_k} (lr {b.lr:.3g})" for b in best if b.at_edge]
    if not edges:
        return []
    return [f"WARNING: best LR on the edge of the grid (widen it): {'; '.join(edges)}.", ""]


def paired_table(paired: list[cmp.Paired], reference: str, key: str, title: str) -> list[str]:
    what = key.removeprefix("final_")
    show_lr = any(p.lr is not None for p in paired)
    lines = [f"## {title}", "",
             f"Δ = policy − {reference} in {what} over runs matched on seed"
             f"{', LR' if show_lr else ''} and every other swept field: mean ± 95% CI (n pairs).",
             "", "| policy | d_k |" + (" LR |" if show_lr else "") + " Δ | verdict |",
             "|---|---|" + ("---|" if show_lr else "") + "---|---|"]
    for p in paired:
        lr = f" {p.lr:.3g} |" if show_lr else ""
        lines.append(f"| {p.variant} | {p.d_k} |{lr} {p.difference.format(4)} | {p.decision} |")
    return lines


def instability_table(rows: list[dict]) -> list[str]:
    """Every run with a failure of the taxonomy, the kinds named, once for the whole report."""
    failed = [(r, kinds) for r in rows if (kinds := failures.row_failures(r))]
    counts = {kind: sum(kind in k for _, k in failed) for kind in failures.FAILURE_KINDS}
    lines = ["## Runs with a failure kind", "",
             f"{len(failed)} of {len(rows)} runs have a failure kind of the taxonomy of "
             "scale_ablation/analysis/failures.py ("
             + ", ".join(f"{n} {kind}" for kind, n in counts.items()) + "):", "",
             *[f"- {kind}: {failures.FAILURE_MEANINGS[kind]}" for kind in failures.FAILURE_KINDS],
             "", "A failure kind is an outcome, not a fault of the sweep: where a claim is about "
             "a policy failing (not learning, diverging), these runs are its evidence.", ""]
    if not failed:
        return lines
    lines += ["| run | status | failures | diverged at | first spike | entropy collapsed at | "
              "collapsed at | max attention logit |", "|---|---|---|---|---|---|---|---|"]
    show = lambda v: "—" if v is None else str(v)  # noqa: E731
    for r, kinds in failed:
        logit = r.get("max_attention_logit")
        logit = "—" if logit is None or not math.isfinite(logit) else f"{logit:.3g}"
        lines.append(f"| {r['name']} | {r['status']} | {', '.join(kinds)} | "
                     f"{show(r.get('diverged_at_step'))} | {show(r.get('spike_step'))} | "
                     f"{show(r.get('entropy_collapse_step'))} | {show(r.get('collapse_step'))} | "
                     f"{logit} |")
    return lines


def sensitivity_tables(rows: list[dict], reference: str) -> list[str]:
    sensitivity = cmp.lr_sensitivity(rows)
    title = "## LR sensitivity (Wortsman et al. 2023; lower is more robust)"
    if not sensitivity:  # said, so that a reader of a grid-per-policy study knows why
        return [title, "", "Not computed: at every d_k the settings share fewer than "
                f"{cmp.SHARED_LRS_MIN} learning rates (each ran its own grid), and the metric, a "
                "mean over the grid, compares settings only over one grid."
                ] if cmp.has_lr_grid(rows) else []
    lines = [title, "",
             "From the seed-mean loss at each LR that every setting at the d_k ran (LRs a "
             "refinement added near one setting's best left out), so that a column compares "
             "over one grid; only diverged runs count as the initial loss.",
             "", "| policy, d_k | LR sensitivity (nats) |", "|---|---|"]
    lines += [f"| {k} | {v:.4f} |" for k, v in sensitivity.items()]
    by_seed = cmp.lr_sensitivity_by_seed(rows)
    if by_seed:
        lines += ["", "Per seed (each seed's own curve over the grid): mean ± 95% CI (n seeds).", "",
                  "| policy | d_k | LR sensitivity (nats) |", "|---|---|---|"]
        lines += [f"| {name} | {d_k} | {intervals.mean_ci(list(seeds.values())).format(4)} |"
                  for (name, d_k), seeds in by_seed.items()]
    paired = cmp.paired_sensitivity(rows, reference)
    if paired:
        lines += ["", *paired_table(paired, reference, "LR sensitivity (nats)",
                                    f"LR sensitivity paired by seed against {reference}")]
    return lines


def extra_metric_keys(rows: list[dict]) -> list[str]:
    """Accuracy and the longer evaluation lengths (val/loss@N is val/bpb@N times ln 2: one of
    the two is enough; the positions beyond n have their own section, `length_tables`)."""
    return sorted({k for r in rows for k in r
                   if k.startswith("final_val/") and not k.startswith("final_val/loss@")
                   and "_beyond@" not in k and "_degradation@" not in k
                   and r.get(k) is not None})


def beyond_lengths(rows: list[dict]) -> list[int]:
    """The longer evaluation lengths L whose positions beyond n the runs scored."""
    return sorted({int(k.rpartition("@")[2]) for r in rows for k in r
                   if k.startswith("final_val/bpb_beyond@") and r.get(k) is not None})


def length_tables(rows: list[dict], best: list[cmp.BestLR], reference: str) -> list[str]:
    """Per variant and d_k: bits per byte at the training length n, on positions n..L-1 of
    each longer length L, and the degradation (beyond n minus at n); then the degradation
    paired by seed against the reference (each at its own best LR when there is an LR grid)."""
    lengths = beyond_lengths(rows)
    if not lengths:
        return []
    # The test split where every finished run scored the longer lengths on it (the validation
    # bytes chose the LRs); runs made before it existed have validation only.
    split = cmp.report_metric(rows, f"final_val/bpb_degradation@{lengths[0]}").split("/")[0]
    named = "test" if split == "final_test" else "validation"
    lines = ["## Length generalisation: bits per byte beyond the training length n", "",
             f"Beyond n @L: on positions n..L-1 of {named} sequences of length L (never seen "
             "in training; the first n are left out). Δ from n @L: that minus the bits per byte "
             f"at n on the {named} split. Mean ± 95% CI (n seeds).", "",
             "| policy | d_k | at n | " + " | ".join(
                 f"beyond n @{L} | Δ from n @{L}" for L in lengths) + " |",
             "|---|---|---|" + "---|---|" * len(lengths)]
    for name in dict.fromkeys(cmp.variant(r) for r in rows):
        for d_k in sorted({r["d_k"] for r in rows}):
            group = [r for r in rows if cmp.variant(r) == name and r["d_k"] == d_k]
            if not group:
                continue
            cells = [cell(group, f"{split}/bpb_{what}@{L}") for L in lengths
                     for what in ("beyond", "degradation")]
            at_n = cell(group, f"{split}_bpb")
            lines.append(f"| {name} | {d_k} | {at_n} | " + " | ".join(cells) + " |")
    for L in lengths:
        key = f"{split}/bpb_degradation@{L}"
        paired = (cmp.paired_best_lr(best, reference, key, False) if best
                  else cmp.paired_same_lr(rows, reference, key, False))
        where = "each at its own best LR" if best else "at the same LR"
        if paired:
            lines += ["", *paired_table(paired, reference, key,
                                        f"Degradation beyond n at L={L} against {reference}, "
                                        f"{where}")]
    return lines


def write_markdown(rows: list[dict], path: str, reference: str = cmp.DEFAULT_REFERENCE) -> None:
    key, higher = cmp.primary_metric(rows)
    best = cmp.best_lrs(rows, key, higher) if cmp.has_lr_grid(rows) else []
    floor, *rest = noise_floor_lines(rows, reference, key)
    # One paragraph, so that the report's inserted paragraphs still go after it.
    lines = [f"{floor} {PLUS_MINUS}", *rest, *edge_warnings(best),
             *grid_table(rows, "final_val_bpb", "Final validation bits per byte")]
    for extra_key in extra_metric_keys(rows):
        lines += ["", *grid_table(rows, extra_key, f"Final {extra_key.removeprefix('final_')}")]
    learned = [r for r in rows if r.get("final_learned_scale") is not None]
    if learned:  # the value a learned-scale claim is judged on, at every LR (claims take the best)
        lines += ["", *grid_table(learned, "final_learned_scale",
                                  "Final learned scale (mean over layers)", digits=4)]
    if any(r.get("max_attention_logit") is not None for r in rows):  # the logit growth claims
        lines += ["", *grid_table(rows, "max_attention_logit",
                                  "Largest |attention logit| during training (max over layers)",
                                  digits=1)]
    if best:
        lines += ["", *best_lr_table(rows, best, key, optimum.curve_optima(rows, key, higher))]
        at_best = cmp.paired_best_lr(best, reference, key, higher)
        if at_best:
            lines += ["", *paired_table(at_best, reference, key,
                                        f"Paired differences against {reference}, each at its "
                                        "own best LR")]
    same_lr = cmp.paired_same_lr(rows, reference, key, higher)
    if same_lr:
        lines += ["", *paired_table(same_lr, reference, key,
                                    f"Paired differences against {reference} at the same LR")]
    length = length_tables(rows, best, reference)
    if length:
        lines += ["", *length]
    lines += ["", *instability_table(rows)]
    sensitivity = sensitivity_tables(rows, reference)
    if sensitivity:
        lines += ["", *sensitivity]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
