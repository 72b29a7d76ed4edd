"""The report's computations over run rows (one dict per run, `report.summarise_run`): how runs
group, each setting's best learning rate, paired differences against a reference policy, the
seed-to-seed noise floor and Wortsman et al.'s LR sensitivity. Tables, plots and claims format
what these return; nothing here reads files or draws.

Vocabulary: a run's *variant* is its policy plus every override but d_k and the seed (runs of
one variant differ only by seed and are averaged); its *setting* is the variant without the
learning rate (runs of one setting and d_k form a loss-against-LR curve).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import defaultdict

from scale_ablation.analysis import intervals
from scale_ablation.records.run_files import FINISHED

DEFAULT_REFERENCE = "inv_sqrt_dk"
# The table's own axes: every other override makes a separate variant, so that runs differing
# in, say, init gain or learning rate are never averaged together.
TABLE_AXES = ("policy", "model.head_dim", "model.qk_dim", "train.seed")  # d_k is the table axis


def variant(row: dict, also_ignore: tuple[str, ...] = ()) -> str:
    """The policy plus the run's other overrides: `inv_sqrt_dk (init_gain=2.0)`."""
    extras = [f"{key.split('.')[-1]}={value}" for name, value in row.items()
              if name.startswith("override:")
              and (key := name.removeprefix("override:")) not in (*TABLE_AXES, *also_ignore)]
    return row["policy"] + (f" ({', '.join(extras)})" if extras else "")


def setting(row: dict) -> str:
    return variant(row, also_ignore=("train.lr",))


def primary_metric(rows: list[dict]) -> tuple[str, bool]:
    """(row key, higher is better): recall accuracy for MQAR, bits per byte otherwise."""
    if rows and all(r.get("task") == "mqar" for r in rows):
        return "final_val/accuracy", True
    return "final_val_bpb", False


def report_metric(rows: list[dict], key: str) -> str:
    """The key a comparison reports: the test split's counterpart of the validation `key`
    (`final_val_bpb` -> `final_test_bpb`) when every finished run has it, else `key` itself.
    The validation split chooses (best LR, best c); the disjoint test split reports, so that
    the bytes that chose a setting do not also grade it."""
    test_key = key.replace("final_val", "final_test", 1)
    finished = [r for r in rows if finished_value(r, key) is not None]
    if finished and all(finished_value(r, test_key) is not None for r in finished):
        return test_key
    return key


def finished_value(row: dict, key: str) -> float | None:
    """The run's `key` if it completed with a finite value (diverged, failed and interrupted
    runs have no final value to average)."""
    value = row.get(key)
    if row["status"] != "completed" or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def estimate(rows: list[dict], key: str) -> intervals.Estimate | None:
    values = [v for r in rows if (v := finished_value(r, key)) is not None]
    return intervals.mean_ci(values) if values else None


def curves(rows: list[dict]) -> dict[tuple[str, int], dict[float, list[dict]]]:
    """(setting, d_k) -> lr -> runs (the seeds), in first-seen order."""
    out: dict = defaultdict(lambda: defaultdict(list))
    for r in rows:
        out[(setting(r), r["d_k"])][r["lr"]].append(r)
    return out


def has_lr_grid(rows: list[dict]) -> bool:
    return any(len(by_lr) > 1 for by_lr in curves(rows).values())


@dataclasses.dataclass(frozen=True)
class BestLR:
    setting: str
    policy: str
    d_k: int
    lr: float | None  # None: no learning rate had every run complete
    estimate: intervals.Estimate | None
    grid: tuple[float, ...]
    runs: tuple[dict, ...]  # the runs at the best learning rate
    chosen_on: str  # the row key the learning rate is best in

    @property
    def at_edge(self) -> bool:
        return self.lr is not None and self.lr in (self.grid[0], self.grid[-1])


def best_lrs(rows: list[dict], key: str, higher_is_better: bool) -> list[BestLR]:
    """Per (setting, d_k) with two or more learning rates: the LR whose runs all completed
    and whose mean `key` over seeds is best."""
    out = []
    for (name, d_k), by_lr in curves(rows).items():
        if len(by_lr) < 2:
            continue
        scored = {lr: estimate(runs, key) for lr, runs in by_lr.items()
                  if all(finished_value(r, key) is not None for r in runs)}
        sign = -1 if higher_is_better else 1
        best = min(scored, key=lambda lr: sign * scored[lr].mean) if scored else None
        policy = next(iter(by_lr.values()))[0]["policy"]
        out.append(BestLR(name, policy, d_k, best, scored.get(best), tuple(sorted(by_lr)),
                          tuple(by_lr.get(best, ())), key))
    return out


def _match_key(row: dict) -> tuple:
    """Everything a run shares with its paired reference run: all but the policy."""
    overrides = tuple(sorted((k, str(v)) for k, v in row.items()
                             if k.startswith("override:") and k != "override:policy"))
    return (row["d_k"], row["seed"], row["lr"], overrides)


@dataclasses.dataclass(frozen=True)
class Paired:
    variant: str  # the compared variant (its learning rate: `lr`)
    policy: str
    d_k: int
    lr: float | None  # None: each at its own best learning rate
    difference: intervals.Estimate  # policy − reference over matched pairs
    decision: str
    differences: tuple[float, ...] = ()  # the matched pairs' policy − reference, for tests
    standing: frozenset[str] = frozenset(("better", "worse", intervals.UNRESOLVED))  # see below


def paired_same_lr(rows: list[dict], reference: str, key: str,
                   higher_is_better: bool) -> list[Paired]:
    """Each non-reference variant against the reference policy's run with the same seed, LR
    and every other swept field; pairs where either run has no final value are dropped."""
    references = {_match_key(r): r for r in rows if r["policy"] == reference}
    groups: dict = defaultdict(list)
    for r in rows:
        ref = references.get(_match_key(r))
        if r["policy"] == reference or ref is None:
            continue
        pair = (finished_value(r, key), finished_value(ref, key))
        groups[(setting(r), r["policy"], r["d_k"], r["lr"])].append(pair)
    return _paired(groups, higher_is_better)


def diverged_at_same_lr(rows: list[dict], reference: str) -> list[tuple]:
    """(setting, d_k, lr, diverged, runs, the matched reference runs that diverged) wherever
    `paired_same_lr` loses pairs to a divergence (a diverged run has no final value)."""
    references = {_match_key(r): r for r in rows if r["policy"] == reference}
    counts: dict = defaultdict(lambda: [0, 0, 0])
    for r in rows:
        ref = references.get(_match_key(r))
        if r["policy"] == reference or ref is None:
            continue
        count = counts[(setting(r), r["policy"], r["d_k"], r["lr"])]
        count[0] += r["status"] == "diverged"
        count[1] += 1
        count[2] += ref["status"] == "diverged"
    return [(*key, *count) for key, count in counts.items() if count[0] or count[2]]


# A decision a wider LR grid could reverse: one side's best LR sits on its grid's edge.
AT_EDGE = "not established (best LR at a grid edge)"


def paired_best_lr(best: list[BestLR], reference: str, key: str,
                   higher_is_better: bool) -> list[Paired]:
    """Each setting at its own best LR against the reference at its own, matched on seed (and
    the fields the two settings share). A side whose best LR is on its grid's edge may do better
    beyond it, so only the decision that survives that stands: "better" when the compared
    setting is at an edge, "worse" when the reference is; anything else is AT_EDGE. On another
    metric than the LRs were chosen on (the degradation beyond the training length, say), a
    wider grid can move it either way: an edge on either side leaves every decision AT_EDGE."""
    groups: dict = defaultdict(list)
    standing: dict = {}  # (setting, d_k) -> the decisions a wider grid cannot reverse
    refs = {(b.setting, b.d_k): b for b in best if b.policy == reference and b.lr is not None}
    for b in best:
        # The reference with the same other fields: `none (gain=2)` against `inv_sqrt_dk (gain=2)`.
        ref = refs.get((reference + b.setting.removeprefix(b.policy), b.d_k))
        if b.policy == reference or ref is None or b.lr is None:
            continue
        by_seed = {r["seed"]: r for r in ref.runs}
        for r in b.runs:
            if r["seed"] in by_seed:
                pair = (finished_value(r, key), finished_value(by_seed[r["seed"]], key))
                groups[(b.setting, b.policy, b.d_k, None)].append(pair)
        standing[(b.setting, b.d_k)] = _standing(b, ref, same_metric=b.chosen_on == key)
    out = []
    for p in _paired(groups, higher_is_better):
        stands = frozenset(standing[(p.variant, p.d_k)])
        decision = p.decision if p.decision in stands | {intervals.TOO_FEW} else AT_EDGE
        out.append(dataclasses.replace(p, decision=decision, standing=stands))
    return out


def _standing(compared: BestLR, reference: BestLR, same_metric: bool) -> set[str]:
    """The decisions that stand with these best LRs (see `paired_best_lr`)."""
    if not same_metric:
        at_edge = compared.at_edge or reference.at_edge
        return set() if at_edge else {"better", "worse", intervals.UNRESOLVED}
    standing = {"better"} if compared.at_edge else {"better", "worse", intervals.UNRESOLVED}
    return standing & {"worse"} if reference.at_edge else standing


def _paired(groups: dict, higher_is_better: bool) -> list[Paired]:
    out = []
    for (name, policy, d_k, lr), pairs in groups.items():
        pairs = [(v, r) for v, r in pairs if v is not None and r is not None]
        if not pairs:
            continue
        diff = intervals.paired([v for v, _ in pairs], [r for _, r in pairs])
        decision = intervals.decide(diff, higher_is_better=higher_is_better)
        out.append(Paired(name, policy, d_k, lr, diff, decision,
                          differences=tuple(v - r for v, r in pairs)))
    return out


@dataclasses.dataclass(frozen=True)
class NoiseFloor:
    """Seed-to-seed sample std of the reference's final metric, over its (d_k, LR) groups with
    two or more completed seeds."""

    stds: tuple[float, ...]
    seeds: tuple[int, ...]  # completed seeds per group

    @property
    def median(self) -> float:
        return statistics.median(self.stds)


def noise_floor(rows: list[dict], reference: str, key: str) -> NoiseFloor | None:
    groups: dict = defaultdict(list)
    for r in rows:
        if r["policy"] == reference and (v := finished_value(r, key)) is not None:
            groups[(variant(r), r["d_k"])].append(v)
    spread = [(statistics.stdev(v), len(v)) for v in groups.values() if len(v) >= 2]
    if not spread:
        return None
    return NoiseFloor(tuple(s for s, _ in spread), tuple(n for _, n in spread))


def _sensitivity(by_lr: dict[float, list[float]], loss_init: float) -> float:
    losses = [statistics.fmean(values) for values in by_lr.values()]
    return statistics.fmean(losses) - min(losses)


def _loss_or_init(row: dict, loss_init: float) -> float | None:
    """min(final loss, loss_init) for a completed run; loss_init for a diverged one; None
    (left out) for a failed or interrupted run, which says nothing about the learning rate."""
    if row["status"] == "diverged":
        return loss_init
    value = finished_value(row, "final_val_loss")
    return None if value is None else min(value, loss_init)


def _initial_loss(by_lr: dict[float, list[dict]]) -> float | None:
    """The mean initial validation loss of a curve's runs; None for a curve of fewer than two
    learning rates or without step-0 evaluations (no sensitivity to measure)."""
    init = [r["initial_val_loss"] for runs in by_lr.values() for r in runs
            if r.get("initial_val_loss") is not None]
    return statistics.fmean(init) if len(by_lr) >= 2 and init else None


SHARED_LRS_MIN = 2  # the metric is a mean over a grid less its minimum: one LR gives 0


def sensitivity_curves(rows: list[dict]) -> dict[tuple[str, int], dict[float, list[dict]]]:
    """`curves` kept to the LRs that every setting at its d_k ran (settings of one LR aside),
    so that every value in a d_k's column is a mean over one grid: a refined grid adds points
    near each setting's own best, which would weigh each mean towards its own optimum (Wortsman
    et al. use one grid for every setting). A d_k whose settings share fewer than
    SHARED_LRS_MIN LRs (each policy on its own grid, as in dk_sweep) has no sensitivity."""
    found = curves(rows)
    shared: dict = {}
    for (_, d_k), by_lr in found.items():
        if len(by_lr) > 1:
            shared[d_k] = shared.get(d_k, set(by_lr)) & set(by_lr)
    return {(name, d_k): {lr: runs for lr, runs in by_lr.items() if lr in shared[d_k]}
            for (name, d_k), by_lr in found.items()
            if len(by_lr) > 1 and len(shared[d_k]) >= SHARED_LRS_MIN}


def lr_sensitivity(rows: list[dict]) -> dict[str, float]:
    """Wortsman et al. 2023: E_lr[min(loss(lr), loss_init) − min_lr loss(lr)], per setting and
    d_k, from final validation losses (a diverged run counts as loss_init, the mean initial
    validation loss of the group), over the LRs every setting at the d_k ran
    (`sensitivity_curves`). Each learning rate weighs the same: its loss is the mean over its
    runs (seeds)."""
    out = {}
    for (name, d_k), by_lr in sensitivity_curves(rows).items():
        if (loss_init := _initial_loss(by_lr)) is None:
            continue
        losses = {lr: [v for r in runs if (v := _loss_or_init(r, loss_init)) is not None]
                  for lr, runs in by_lr.items()}
        losses = {lr: v for lr, v in losses.items() if v}
        if len(losses) >= 2:
            out[f"{name} d_k={d_k}"] = _sensitivity(losses, loss_init)
    return out


def lr_sensitivity_by_seed(rows: list[dict]) -> dict[tuple[str, int], dict[int, float]]:
    """(setting, d_k) -> seed -> that seed's own LR sensitivity (its curve over the grid), so
    that the metric gets a CI over seeds and pairs by seed across policies; over the shared
    grid, as `lr_sensitivity`."""
    out: dict = {}
    for (name, d_k), by_lr in sensitivity_curves(rows).items():
        if (loss_init := _initial_loss(by_lr)) is None:
            continue
        per_seed: dict = defaultdict(dict)
        for lr, runs in by_lr.items():
            for r in runs:
                if (v := _loss_or_init(r, loss_init)) is not None:
                    per_seed[r["seed"]][lr] = [v]
        complete = {seed: _sensitivity(curve, loss_init) for seed, curve in per_seed.items()
                    if len(curve) == len(by_lr)}
        if complete:
            out[(name, d_k)] = complete
    return out


def paired_sensitivity(rows: list[dict], reference: str) -> list[Paired]:
    """Each setting's per-seed LR sensitivity against the reference's (same other fields),
    paired by seed; lower is more robust."""
    by_seed = lr_sensitivity_by_seed(rows)
    policy_of = {setting(r): r["policy"] for r in rows}
    groups: dict = defaultdict(list)
    for (name, d_k), seeds in by_seed.items():
        policy = policy_of[name]
        ref = by_seed.get((reference + name.removeprefix(policy), d_k))
        if policy == reference or ref is None:
            continue
        for seed in sorted(set(seeds) & set(ref)):
            groups[(name, policy, d_k, None)].append((seeds[seed], ref[seed]))
    return _paired(groups, higher_is_better=False)


def log10_rows(rows: list[dict], key: str) -> list[dict]:
    """Copies of `rows` with `key` replaced by its log10 (None where not finite and positive):
    heavy-tailed metrics (max |logit|) are averaged and compared as logs."""
    def log(value):
        ok = isinstance(value, (int, float)) and math.isfinite(value) and value > 0
        return math.log10(value) if ok else None
    return [{**r, key: log(r.get(key))} for r in rows]


def finished_rows(rows: list[dict]) -> list[dict]:
    """The rows of runs that finished (completed or diverged): all a verdict rests on."""
    return [r for r in rows if r.get("status") in FINISHED]
