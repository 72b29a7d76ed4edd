"""How much each intervention of a run acted, from its logged rows: the run row's fields that
`analysis.acted` judges (issue 54). Only the fields a run logged are given, so that the rows of
runs made before them stay as they were (published summary.csv files regenerate unchanged)."""

from __future__ import annotations

from scale_ablation.records import metrics_rows as rm


def acted_fields(metrics: list[dict], summary: dict) -> dict:
    """qk_clip_max_logit, the largest logit a QK-clip train step saw at a diagnostics step;
    qk_clip_clips (/layer{i}), head-steps clipped over the whole run, and qk_clip_step_share,
    the most-clipped head's share of steps; softcap_past_knee (/layer{i}), the largest share of
    logits past a soft-cap's knee in a diagnostics pass; z_loss_share, the z-loss's largest
    share of the objective; skipped_steps, a dynamic loss scale's."""
    out: dict = {}
    sampled = [v for row in metrics for v in rm.head_values(row, "qk_clip_max_logit").values()]
    if sampled:
        out["qk_clip_max_logit"] = max(sampled)
    out.update(_clip_counts(metrics))
    past = rm.max_over_training(metrics, "softcap_past_knee")
    if past:
        out["softcap_past_knee"] = max(past.values())
        out.update({f"softcap_past_knee/layer{i}": v for i, v in sorted(past.items())})
    shares = [r["diag/z_loss_share"] for r in metrics if r.get("diag/z_loss_share") is not None]
    if shares:
        out["z_loss_share"] = max(shares)
    if summary.get("skipped_steps") is not None:
        out["skipped_steps"] = summary["skipped_steps"]
    return out


def _clip_counts(metrics: list[dict]) -> dict:
    """QK-clip's counts at the last diagnostics step (they accumulate over the run)."""
    last = next((r for r in reversed(metrics)
                 if rm.head_values(r, "qk_clip_clipped_steps")), None)
    if last is None:
        return {}
    counts = rm.head_values(last, "qk_clip_clipped_steps")
    layers = sorted({layer for layer, _ in counts})
    return {"qk_clip_clips": sum(counts.values()),
            **{f"qk_clip_clips/layer{i}": sum(v for (layer, _), v in counts.items() if layer == i)
               for i in layers},
            "qk_clip_step_share": max(counts.values()) / last["step"] if last["step"] else 0.0}
