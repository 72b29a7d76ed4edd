"""Did it act? Whether the interventions a claim compares acted in the runs it compares, and
the rule that follows (issue 54): a claim that an intervention "costs nothing" or "helps" says
nothing when the intervention never did anything in those runs.

**The rule.** A `Compare` or `Diverges` claim compares arms; an arm's *compared interventions*
are those its runs have and the other arm's do not (`interventions`). Each is judged in the
runs the claim compares (`compared_runs`: each at its best LR for a best-LR comparison, at
every LR from `min_lr` for a comparison at each LR, every run otherwise). When one of them
acted in none of those runs (every run "did not act", none unknown), the claim is **not
exercised**, whatever the comparison alone says (that is given beside it), and it says where
the intervention first acts in the study's grid (the lowest LR at each d_k at which one of its
runs acted), if anywhere. Otherwise the verdict stands, and a line per compared intervention
says how much it acted, with the number. Its tests stay in the study's Holm family, so that no
other claim's adjusted p moves.

**Evidence**, per run, from its row (`records.intervention_rows`; runs made before those fields
existed are judged on what their rows hold, and the line says which):

- `qk_clip:T` (QK-clip): acted when a head was clipped at some step (`qk_clip_clips`, counted
  at every step). Older runs: acted when a logit recorded at a diagnostics step reached T (the
  train step's largest logit, `qk_clip_max_logit`, else the largest |logit| of the validation
  batch, `max_attention_logit`; both recorded only every `train.diag_every` steps), or when the
  run's loss differs by more than round-off (`ROUND_OFF`) from its twin without the clip (the
  same policy without `qk_clip:T`, at the same seed, LR and other settings: the same arithmetic,
  so only a clip can move it); it did not act when neither happened.
- `softcap:C`: acted when a logit passed the knee |z| > C/2, where the cap bends it by 7.6% or
  more (`softcap_past_knee`, the largest share in a diagnostics pass). Older runs: the largest
  |logit| recorded after the cap (`max_attention_logit`) against C·tanh(½), the knee's image.
- z-loss (`train.z_loss`): acted when its share of the objective (`z_loss_share`) is above
  zero: the cross-entropy is blind to a shift of every output logit, which the z-loss alone
  acts on, however small its share (which the line gives); not recorded before issue 54.
- a learned scale (`learned`, `learned_per_head`): acted when its final value (the layer mean,
  `final_learned_scale`) is `LEARNED_FLOOR` or more away from its initial value, in ratio.
- a loss scale (`train.loss_scale`, `train.loss_scale_period`): it multiplies every step's loss,
  so it always acts; the steps a dynamic one skipped are its number (`skipped_steps`).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import defaultdict
from collections.abc import Callable, Sequence

from scale_ablation.analysis import comparisons as cmp
from scale_ablation.analysis.claims import Compare, Diverges, Verdict

NOT_EXERCISED = "not exercised"
ACTED, IDLE, UNKNOWN = "acted", "did not act", "unknown"
TAG = "_interventions"  # the row key `tag` adds, kept through Arms' relabelling
# Two compilations of the same arithmetic (qk_clip:50 and 1/√d_k where no logit reached 50, in
# stabilisers_cpu) ended at most 2.2e-6 bits per byte apart; a clip that fired moved the final
# loss by 0.04 or more there. 1e-5 lies between, with room on both sides.
ROUND_OFF = 1e-5
LEARNED_FLOOR = 0.01  # a scale within 1% of its start multiplies every logit by at most 1.01
_COMPOSITION = re.compile(r"\+(?=[A-Za-z_])")  # as `policies` splits `A+B`


@dataclasses.dataclass(frozen=True)
class Intervention:
    kind: str  # "qk_clip" | "softcap" | "z_loss" | "learned_scale" | "loss_scale"
    value: float | None  # T, C, the z-loss weight, the scale's start (None: 1/√d_k), the period
    label: str  # as claims.md names it


@dataclasses.dataclass(frozen=True)
class Evidence:
    state: str  # ACTED | IDLE | UNKNOWN
    measures: dict  # what the line reports, by name


# --------------------------------------------------------------------------- which interventions


def _number(value: object) -> float:
    try:
        return float(value or 0.0)
    except (TypeError, ValueError):
        return 0.0


def _policy_part(part: str) -> Intervention | None:
    name, _, arg = part.partition(":")
    if name == "qk_clip":
        return Intervention("qk_clip", float(arg or 100.0), part)
    if name == "softcap":
        return Intervention("softcap", float(arg or 50.0), part)
    if name in ("learned", "learned_per_head"):
        return Intervention("learned_scale", float(arg) if arg else None, f"learned scale ({part})")
    return None


def interventions(row: dict) -> tuple[Intervention, ...]:
    """The interventions of a run that can be inactive, from its scale policy's parts (the
    built-in names and their defaults: qk_clip's T 100, softcap's C 50) and its overrides."""
    out = [found for part in _COMPOSITION.split(str(row.get("policy", "")))
           if (found := _policy_part(part)) is not None]
    if z_loss := _number(row.get("override:train.z_loss")):
        out.append(Intervention("z_loss", z_loss, f"z-loss {z_loss:g}"))
    if period := _number(row.get("override:train.loss_scale_period")):
        out.append(Intervention("loss_scale", period, f"dynamic loss scale (period {period:g})"))
    elif (static := _number(row.get("override:train.loss_scale"))) not in (0.0, 1.0):
        out.append(Intervention("loss_scale", 0.0, f"static loss scale {static:g}"))
    return tuple(out)


def tag(rows: Sequence[dict]) -> list[dict]:
    """The rows, each with its interventions under TAG: read before a rule relabels its arms
    (`claims.Arms` moves the swept field out of the row)."""
    return [{**r, TAG: interventions(r)} for r in rows]


# --------------------------------------------------------------------------- evidence per run


def _twin_key(row: dict) -> tuple:
    """What a run shares with its twin without the clip: all but the scale policy."""
    overrides = tuple(sorted((k, str(v)) for k, v in row.items() if k.startswith("override:")
                             and k not in ("override:policy", "override:scale_policy")))
    arm = row["policy"] if "override:scale_policy" in row else None
    return (row["d_k"], row["seed"], row["lr"], arm, overrides)


def _unclipped(policy: str) -> str:
    parts = [p for p in _COMPOSITION.split(policy) if p.partition(":")[0] != "qk_clip"]
    return "+".join(parts) or "inv_sqrt_dk"


def _twin_delta(row: dict, rows: Sequence[dict]) -> tuple[str, float] | None:
    """(twin's policy, largest |Δ| of the final validation and test bits per byte) against the
    run's twin without the clip, None when the study has none."""
    policy = row.get("override:scale_policy") or row["policy"]
    twin_policy, key = _unclipped(policy), _twin_key(row)
    for other in rows:
        if (other.get("override:scale_policy") or other["policy"]) == twin_policy \
                and _twin_key(other) == key:
            deltas = [abs(row[k] - other[k]) for k in ("final_val_bpb", "final_test_bpb")
                      if isinstance(row.get(k), float) and isinstance(other.get(k), float)]
            return (twin_policy, max(deltas)) if deltas else None
    return None


def _qk_clip(found: Intervention, row: dict, rows: Sequence[dict]) -> Evidence:
    if row.get("qk_clip_clips") is not None:
        return Evidence(ACTED if row["qk_clip_clips"] > 0 else IDLE,
                        {"clips": row["qk_clip_clips"], "share": row.get("qk_clip_step_share")})
    sampled = row.get("qk_clip_max_logit", row.get("max_attention_logit"))
    twin = _twin_delta(row, rows)
    measures = {"sampled": sampled, "train_step": "qk_clip_max_logit" in row, "twin": twin}
    if (sampled is not None and sampled >= found.value) or (twin and twin[1] > ROUND_OFF):
        return Evidence(ACTED, measures)
    return Evidence(UNKNOWN if sampled is None and twin is None else IDLE, measures)


def _softcap(found: Intervention, row: dict, rows: Sequence[dict]) -> Evidence:
    if row.get("softcap_past_knee") is not None:
        share = row["softcap_past_knee"]
        return Evidence(ACTED if share > 0 else IDLE, {"share": share})
    largest = row.get("max_attention_logit")
    if largest is None:
        return Evidence(UNKNOWN, {})
    past = largest >= found.value * math.tanh(0.5)
    return Evidence(ACTED if past else IDLE, {"largest": largest})


def _z_loss(found: Intervention, row: dict, rows: Sequence[dict]) -> Evidence:
    share = row.get("z_loss_share")
    if share is None:
        return Evidence(UNKNOWN, {})
    return Evidence(ACTED if share > 0 else IDLE, {"share": share})


def _learned(found: Intervention, row: dict, rows: Sequence[dict]) -> Evidence:
    final = row.get("final_learned_scale")
    if not isinstance(final, (int, float)) or final <= 0:
        return Evidence(UNKNOWN, {})
    start = found.value if found.value is not None else 1.0 / math.sqrt(row["d_k"])
    ratio = final / start
    moved = abs(math.log(ratio)) >= math.log1p(LEARNED_FLOOR)
    return Evidence(ACTED if moved else IDLE, {"ratio": ratio})


def _loss_scale(found: Intervention, row: dict, rows: Sequence[dict]) -> Evidence:
    return Evidence(ACTED, {"skipped": row.get("skipped_steps")})


_JUDGES: dict[str, Callable[[Intervention, dict, Sequence[dict]], Evidence]] = {
    "qk_clip": _qk_clip, "softcap": _softcap, "z_loss": _z_loss,
    "learned_scale": _learned, "loss_scale": _loss_scale}


def evidence(found: Intervention, row: dict, rows: Sequence[dict]) -> Evidence:
    """Whether `found` acted in the run of `row`; `rows`: the study's, for a twin."""
    return _JUDGES[found.kind](found, row, rows)


# --------------------------------------------------------------------------- what a line says


def _qk_clip_text(found: Intervention, found_in: list[Evidence]) -> list[str]:
    out = []
    if counted := [e.measures for e in found_in if "clips" in e.measures]:
        clips = sum(m["clips"] for m in counted)
        share = max(m["share"] or 0.0 for m in counted)
        out.append(f"{clips:g} head-steps clipped, counted at every step (the most-clipped head: "
                   f"{share:.1%} of its run's steps)" if clips else
                   "no head clipped at any step, counted at every step")
    if sampled := [e.measures for e in found_in if e.measures.get("sampled") is not None]:
        largest = max(m["sampled"] for m in sampled)
        which = ("its train steps' largest logit" if all(m["train_step"] for m in sampled)
                 else "the largest |logit| of its diagnostics")
        out.append(f"{which}, recorded every train.diag_every steps only, reached {largest:.3g} "
                   f"({'≥' if largest >= found.value else '<'} T = {found.value:g})")
    if twins := [e.measures["twin"] for e in found_in if e.measures.get("twin")]:
        delta = max(t[1] for t in twins)
        out.append(f"its final loss equals that of its twin without the clip ({twins[0][0]}, same "
                   f"seed and LR) to round-off (|Δ| ≤ {delta:.1e} bits per byte)"
                   if delta <= ROUND_OFF else
                   f"its final loss differs from that of its twin without the clip ({twins[0][0]}, "
                   f"same seed and LR) by up to {delta:.3g} bits per byte")
    return out


def _softcap_text(found: Intervention, found_in: list[Evidence]) -> list[str]:
    knee = f"the knee |z| > C/2 = {found.value / 2:g}"
    if shares := [e.measures["share"] for e in found_in if "share" in e.measures]:
        return [f"at most {max(shares):.3%} of the logits of a diagnostics pass past {knee}"]
    if largest := [e.measures["largest"] for e in found_in if "largest" in e.measures]:
        top, cap = max(largest), found.value
        before = f"{cap * math.atanh(top / cap):.3g} before it" if top < cap else "at the cap"
        where = "past" if top >= cap * math.tanh(0.5) else "short of"
        return [f"the largest |logit| recorded after the cap, every train.diag_every steps only, "
                f"was {top:.3g} ({before}), {where} {knee}; the share of logits past it was not "
                "recorded for these runs (before issue 54)"]
    return []


def _z_loss_text(found: Intervention, found_in: list[Evidence]) -> list[str]:
    if shares := [e.measures["share"] for e in found_in if "share" in e.measures]:
        return [f"its share of the objective reached {max(shares):.3%} at most (in a diagnostics "
                "pass, every train.diag_every steps)"]
    return ["its share of the objective was not recorded for these runs (before issue 54)"]


def _learned_text(found: Intervention, found_in: list[Evidence]) -> list[str]:
    if ratios := [e.measures["ratio"] for e in found_in if "ratio" in e.measures]:
        span = (f"×{min(ratios):.3g}" if len(set(ratios)) == 1
                else f"×{min(ratios):.3g} to ×{max(ratios):.3g}")
        return [f"it ended at {span} its start (the layer mean at the last diagnostics; it acts "
                f"from ±{LEARNED_FLOOR:.0%})"]
    return []


def _loss_scale_text(found: Intervention, found_in: list[Evidence]) -> list[str]:
    skipped = [e.measures["skipped"] for e in found_in if e.measures.get("skipped") is not None]
    if skipped:
        return [f"it multiplies every step's loss; it skipped {sum(skipped):g} steps in all "
                f"({max(skipped):g} at most in one run)"]
    return ["it multiplies every step's loss; the steps it skipped were not recorded for these "
            "runs (before issue 54)"]


_TEXTS: dict[str, Callable[[Intervention, list[Evidence]], list[str]]] = {
    "qk_clip": _qk_clip_text, "softcap": _softcap_text, "z_loss": _z_loss_text,
    "learned_scale": _learned_text, "loss_scale": _loss_scale_text}


def _runs_text(runs: list[dict]) -> str:
    lrs = ", ".join(f"{lr:.3g}" for lr in sorted({r["lr"] for r in runs}))
    d_ks = ", ".join(str(d) for d in sorted({r["d_k"] for r in runs}))
    return f"LR {lrs}, d_k {d_ks}"


def _state_text(found_in: list[Evidence]) -> str:
    n = len(found_in)
    acted = sum(e.state == ACTED for e in found_in)
    unknown = sum(e.state == UNKNOWN for e in found_in)
    if unknown == n:
        return f"not known for its {n} runs"
    if acted == n:
        return f"yes, in all {n} runs"
    if not acted and not unknown:
        return f"no, in none of its {n} runs"
    return f"in {acted} of {n} runs" + (f" ({unknown} not known)" if unknown else "")


def first_acts(found: Intervention, side_rows: list[dict], rows: Sequence[dict]) -> str:
    """Where in the grid the intervention first acts: the lowest LR at each d_k at which one
    of its runs acted (`side_rows`: the arm's runs at every LR and d_k of the claim)."""
    by_d_k: dict = defaultdict(set)
    for r in side_rows:
        if evidence(found, r, rows).state == ACTED:
            by_d_k[r["d_k"]].add(r["lr"])
    if not by_d_k:
        return "it acts at no LR or d_k of this study's grid"
    return "it first acts at " + "; ".join(
        f"LR {min(by_d_k[d_k]):.3g} (d_k {d_k})" for d_k in sorted(by_d_k))


# --------------------------------------------------------------------------- the rule


def compared_runs(rule: Compare | Diverges, side: str, rows: Sequence[dict]) -> list[dict]:
    """The runs of arm `side` that the rule compares (see the module's rule)."""
    mine = [r for r in rows if r["policy"] == side and r["d_k"] >= getattr(rule, "min_d_k", 0)]
    if isinstance(rule, Compare) and rule.metric != "lr_sensitivity":
        if rule.at == "best_lr":
            key, higher = cmp.primary_metric(list(rows))
            return [r for best in cmp.best_lrs(mine, key, higher) for r in best.runs]
        if rule.at == "each_lr":
            return [r for r in mine if r["lr"] >= rule.min_lr]
    return mine


def _sides(rule: Compare | Diverges, rows: Sequence[dict]) -> list[tuple[str, str]]:
    """(arm, the arm it is compared with) of every comparison the rule makes, both ways."""
    arms = list(rule.policies) or sorted({r["policy"] for r in rows} - {rule.reference})
    return [pair for arm in arms for pair in ((arm, rule.reference), (rule.reference, arm))]


def _found(runs: list[dict]) -> list[Intervention]:
    out: dict = {}
    for r in runs:
        out.update(dict.fromkeys(r[TAG] if TAG in r else interventions(r)))
    return list(out)


def _extras(row: dict) -> str:
    """A run's setting without its policy: what pairs it with the other arm's runs."""
    return cmp.setting(row).removeprefix(row["policy"])


def compared_interventions(rule: Compare | Diverges, rows: Sequence[dict]
                           ) -> list[tuple[Intervention, list[dict]]]:
    """(intervention, the compared runs of the arm that has it) for each intervention an arm's
    compared runs have and the runs they are paired with lack, each once. An arm's runs count
    only where the other arm has runs of the same setting (1/√d_k without z-loss against a
    soft-cap without it, not the z-loss runs of 1/√d_k)."""
    out: dict = {}
    for side, other in _sides(rule, rows):
        theirs = compared_runs(rule, other, rows)
        settings = {_extras(r) for r in theirs}
        mine = [r for r in compared_runs(rule, side, rows) if _extras(r) in settings]
        paired = {_extras(r) for r in mine}
        lacking = set(_found([r for r in theirs if _extras(r) in paired]))
        for found in _found(mine):
            if found not in lacking:
                out.setdefault((side, found), mine)
    return [(found, runs) for (_, found), runs in out.items()]


def annotate(verdict: Verdict, rule: object, rows: Sequence[dict]) -> Verdict:
    """`verdict` with a line per compared intervention saying whether it acted; NOT_EXERCISED
    when one acted in none of the compared runs (module docstring). `rows`: the claim's rows
    (`tag`ged before any relabelling), finished runs only."""
    if not isinstance(rule, (Compare, Diverges)):
        return verdict
    lines, idle = [], []
    for found, runs in compared_interventions(rule, rows):
        found_in = [evidence(found, r, rows) for r in runs]
        said = "; ".join(_TEXTS[found.kind](found, found_in))
        line = (f"did it act? {found.label} (compared at {_runs_text(runs)}): "
                f"{_state_text(found_in)}" + (f": {said}" if said else ""))
        if all(e.state == IDLE for e in found_in):
            where = first_acts(found, [r for r in rows if r["policy"] == runs[0]["policy"]
                                       and _extras(r) == _extras(runs[0])], rows)
            line += f"; {where}"
            idle.append(f"{found.label} did not act in the {len(runs)} compared runs "
                        f"({_runs_text(runs)}); {where}")
        lines.append(line)
    numbers = (*verdict.numbers, *lines)
    if idle:
        return Verdict(NOT_EXERCISED, "; ".join(idle) + f" (the comparison alone: "
                       f"{verdict.verdict})", numbers)
    return dataclasses.replace(verdict, numbers=numbers)
