"""The failure taxonomy of a training run, stated once: pure functions over its metrics rows.

Rows are the lines of metrics.jsonl: dicts with a "step" and the metrics logged at it, e.g.
"train/loss" (every log step), "val/loss" (every evaluation, nats per byte on LM tasks),
"attn/layer{i}/entropy_normalised" and "attn/layer{i}/head{j}/entropy_normalised" (every
diagnostics step), and "train/diverged" (1.0 on the row where the loop stopped a non-finite
step). Missing keys and None values are skipped. `classify` returns every kind that applies, in
the order of FAILURE_KINDS; an empty list means the run trains smoothly.

- diverged: a logged non-finite train/loss or val/loss, a "train/diverged" row, or the run's
  status (summary.json) "diverged". Non-finite values are left out of every other rule.
- spiked: a training loss, at a step after warmup, above the trend of the run's own recent
  losses by more than SPIKE_NOISE_FACTOR times its step-to-step noise and by at least
  SPIKE_MIN_RISE nats. The series judged is every step's loss when the run has it (the loop
  keeps it in train_losses.jsonl and judges its summary's `spike_step` on it, saying so in
  `spike_judged_on`: EVERY_STEP), else, for runs made before it was kept, the losses of the
  logged rows (every train.log_every steps: a spike that falls between two logged steps is not
  seen). Each point of either series is one step's minibatch loss, so the noise and the bound
  mean the same on both. The trend is the median of the previous SPIKE_WINDOW losses of the
  series (warmup steps included), so it lags a descent (residuals are negative while the loss falls:
  no false alarms on a fast but smooth descent), is unmoved by one outlier, and sees a jump
  that does not come back down at its first step (a centred window would hide it). The noise
  is 1.4826 × MAD / √2 of the first differences of the post-warmup losses: differencing removes
  the slow trend, MAD ignores the spikes themselves, and for white noise of s.d. σ it estimates
  σ. At 6σ a Gaussian residual (s.d. about 1.08σ against a 10-point median) exceeds the bound
  with probability ~1e-8, so a run of tens of thousands of steps raises no false alarm (on
  every step's loss of eight 600-step runs of the `cpu` config at LR 1e-3 to 3e-2, 4,400 steps
  after warmup, the largest residual was 4.4 noise units); minibatch
  loss noise has heavier tails than that, which is what the margin is for. The absolute floor
  keeps a solved task from spiking: an MQAR run recalling 99% of queries moves between losses of
  0.02 and 0.06 (the last few errors), three times its minimum and nothing a researcher would
  call an instability; 0.1 nats is ~4% of a text model's loss of 2-3 nats.
- entropy_collapsed: the normalised attention entropy (entropy over log of the keys each query
  sees, diagnostics.py) of any head below ENTROPY_COLLAPSE at a diagnostics step after warmup;
  per-head keys when a row has them, else the per-layer means. 0.05 is the calibration on this
  repo's summary.csv files (final layer-mean entropy of 524 LM runs): 88% of the runs that end
  below 0.05 do no better than the bigram baseline, against 35% of those in [0.05, 0.1) and 14%
  of those in [0.2, 0.3), a bin whose median loss (2.00 nats) is that of the runs above 0.4
  (1.95-1.99) and which holds the lowest loss of all (1.69): a threshold of 0.3 would call some
  of the best runs collapsed. At seq_len 128 a query of normalised entropy 0.05 spreads its
  weight over exp(0.05 · ln 128) ≈ 1.3 keys: one-hot attention. The per-head rule is stricter
  than the layer means it was calibrated on (a head is below its layer's mean), and a healthy
  model may keep a sharp previous-token head; recalibrate on per-head rows when they are at
  hand.
- not_learning: the run's last finite validation loss is at or above the bigram baseline's loss
  (same units): after all its training it predicts no better than counting byte pairs.
- collapsed: instability.py's rule, kept: a validation loss, at an evaluation after warmup, at
  or above (1 − COLLAPSE_MARGIN) times the unigram baseline loss and no lower than the previous
  evaluation's: the run does no better than byte frequencies and has stopped improving (a run
  still descending towards the baseline from its initial loss is slow, not collapsed).

The baseline rules are skipped when the baseline is None (MQAR has no unigram or bigram loss).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

SPIKE_WINDOW = 10  # logged losses in the trailing median
SPIKE_MIN_HISTORY = 3  # a trend needs at least this many earlier losses
SPIKE_NOISE_FACTOR = 6.0  # residual above the trend, in robust noise units
SPIKE_MIN_RISE = 0.1  # nats above the trend, whatever the noise
ENTROPY_COLLAPSE = 0.05  # normalised attention entropy of a head
COLLAPSE_MARGIN = 0.01  # relative: within 1% of the unigram loss counts as reaching it
_MAD_TO_SD = 1.4826  # MAD × this estimates σ for Gaussian noise
# summary.json's `spike_judged_on`: the series its `spike_step` was judged on.
EVERY_STEP, LOGGED_ROWS = "every_step", "logged_rows"

FAILURE_KINDS = ("diverged", "spiked", "entropy_collapsed", "not_learning", "collapsed")
FAILURE_MEANINGS = {
    "diverged": "a training or validation loss became non-finite (NaN or inf)",
    "spiked": "the training loss jumped far above its recent trend after warmup",
    "entropy_collapsed": "some attention head's weights became one-hot (normalised entropy "
                         f"below {ENTROPY_COLLAPSE}) after warmup",
    "not_learning": "the final validation loss is no better than the bigram baseline's",
    "collapsed": "the validation loss rose back to the unigram baseline's and stopped improving",
}

_HEAD_ENTROPY = re.compile(r"attn/layer\d+/head\d+/entropy_normalised")
_LAYER_ENTROPY = re.compile(r"attn/layer\d+/entropy_normalised")


def _number(value: Any) -> float | None:
    """A logged number as float; None for absent, None-valued or non-numeric entries."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def finite_series(rows: Iterable[Mapping[str, Any]], key: str) -> list[tuple[int, float]]:
    """(step, value) of every row with a finite `key`."""
    out = []
    for row in rows:
        value = _number(row.get(key))
        if value is not None and math.isfinite(value):
            out.append((int(row["step"]), value))
    return out


def diverged_step(rows: Iterable[Mapping[str, Any]]) -> int | None:
    """The first step with a non-finite train/loss or val/loss, or a train/diverged flag."""
    for row in rows:
        losses = (_number(row.get(key)) for key in ("train/loss", "val/loss"))
        if any(v is not None and not math.isfinite(v) for v in losses) or row.get(
                "train/diverged"):
            return int(row["step"])
    return None


def is_diverged(rows: Iterable[Mapping[str, Any]], status: str | None = None) -> bool:
    return status == "diverged" or diverged_step(rows) is not None


def step_noise(values: Sequence[float]) -> float:
    """Robust s.d. of the point-to-point noise of a series: 1.4826 × MAD / √2 of its first
    differences (0 with fewer than three differences)."""
    diffs = np.diff(np.asarray(values, dtype=float))
    if diffs.size < 3:
        return 0.0
    mad = np.median(np.abs(diffs - np.median(diffs)))
    return float(_MAD_TO_SD * mad / math.sqrt(2))


def _trailing_medians(values: np.ndarray, window: int) -> np.ndarray:
    """[n]: the median of the (up to) `window` values before each one (nan for the first)."""
    out = np.full(values.shape, np.nan)
    for i in range(1, min(window, values.size)):  # the short windows at the start
        out[i] = np.median(values[:i])
    if values.size > window:  # [n - window, window]: the full windows, one per later value
        windows = np.lib.stride_tricks.sliding_window_view(values[:-1], window)
        out[window:] = np.median(windows, axis=1)
    return out


def spike_step(losses: Sequence[tuple[int, float]], *, warmup_steps: int,
               noise_factor: float = SPIKE_NOISE_FACTOR, min_rise: float = SPIKE_MIN_RISE,
               window: int = SPIKE_WINDOW) -> int | None:
    """The first step after warmup whose loss exceeds the median of the previous `window`
    losses by more than noise_factor × step_noise (post-warmup) and by at least min_rise.
    Vectorised: the loop judges every step's loss of runs of 10^5 steps at each logged row."""
    series = [(s, v) for s, v in losses if math.isfinite(v)]
    if len(series) <= SPIKE_MIN_HISTORY:
        return None
    steps = np.array([s for s, _ in series])
    values = np.array([v for _, v in series], dtype=float)
    noise = step_noise(values[steps > warmup_steps])
    bound = max(noise_factor * noise, min_rise)
    judged = (steps > warmup_steps) & (np.arange(values.size) >= SPIKE_MIN_HISTORY)
    judged[judged] = values[judged] - _trailing_medians(values, window)[judged] > bound
    found = np.flatnonzero(judged)
    return int(steps[found[0]]) if found.size else None


def summary_spike(step_losses: Sequence[tuple[int, float]] | None, *,
                  warmup_steps: int) -> dict[str, Any]:
    """summary.json's spike fields: `spike_step` judged on every step's loss when the run has
    them all, and `spike_judged_on` saying which series (without them, the loop's watch of the
    logged rows keeps its `spike_step`)."""
    if step_losses is None:
        return {"spike_judged_on": LOGGED_ROWS}
    return {"spike_step": spike_step(step_losses, warmup_steps=warmup_steps),
            "spike_judged_on": EVERY_STEP}


def judged_spike_step(rows: Sequence[Mapping[str, Any]], *, warmup_steps: int,
                      step_losses: Sequence[tuple[int, float]] | None = None,
                      summary: Mapping[str, Any] | None = None) -> int | None:
    """The run's spike step by the best series at hand: the summary's `spike_step` when it says
    it was judged on every step's loss (runs since train_losses.jsonl was kept), else
    `step_losses` (every step's (step, loss), what the loop passes), else the logged rows'
    train/loss (older runs, whose every-step losses were never kept: a spike between two
    logged steps goes unseen there)."""
    if summary is not None and summary.get("spike_judged_on") == EVERY_STEP:
        found = _number(summary.get("spike_step"))
        return None if found is None else int(found)
    series = step_losses if step_losses is not None else finite_series(rows, "train/loss")
    return spike_step(series, warmup_steps=warmup_steps)


def _entropies(row: Mapping[str, Any]) -> list[float]:
    """Per-head normalised entropies of a row, or its per-layer ones if it has no head keys."""
    heads = [row[k] for k in row if _HEAD_ENTROPY.fullmatch(k)]
    values = heads or [row[k] for k in row if _LAYER_ENTROPY.fullmatch(k)]
    return [v for v in map(_number, values) if v is not None and math.isfinite(v)]


def entropy_collapse_step(rows: Iterable[Mapping[str, Any]], *, warmup_steps: int,
                          threshold: float = ENTROPY_COLLAPSE) -> int | None:
    """The first diagnostics step after warmup where some head's normalised entropy is below
    `threshold`."""
    for row in rows:
        if int(row["step"]) > warmup_steps and any(v < threshold for v in _entropies(row)):
            return int(row["step"])
    return None


def final_val_loss(rows: Iterable[Mapping[str, Any]]) -> float | None:
    series = finite_series(rows, "val/loss")
    return series[-1][1] if series else None


def not_learning(rows: Iterable[Mapping[str, Any]], *, bigram_loss: float) -> bool:
    """Whether the last finite validation loss is at or above the bigram baseline's."""
    final = final_val_loss(rows)
    return final is not None and final >= bigram_loss


def collapse_step(rows: Iterable[Mapping[str, Any]], *, warmup_steps: int, unigram_loss: float,
                  margin: float = COLLAPSE_MARGIN) -> int | None:
    """The first evaluation after warmup at or above (1 − margin) × the unigram loss whose
    value is no lower than the previous evaluation's."""
    threshold = (1 - margin) * unigram_loss
    previous = math.inf
    for step, value in finite_series(rows, "val/loss"):
        if step > warmup_steps and value >= threshold and value >= previous:
            return step
        previous = value
    return None


def classify(rows: Sequence[Mapping[str, Any]], *, warmup_steps: int,
             unigram_loss: float | None, bigram_loss: float | None,
             status: str | None = None,
             step_losses: Sequence[tuple[int, float]] | None = None,
             summary: Mapping[str, Any] | None = None) -> list[str]:
    """Every failure kind of FAILURE_KINDS that applies to the run, in that order ([] = trains
    smoothly). A None baseline skips the rule that needs it. The spike is judged on the series
    `judged_spike_step` picks from `summary`, `step_losses` and the rows."""
    found = {
        "diverged": is_diverged(rows, status),
        "spiked": judged_spike_step(rows, warmup_steps=warmup_steps, step_losses=step_losses,
                                    summary=summary) is not None,
        "entropy_collapsed": entropy_collapse_step(rows, warmup_steps=warmup_steps) is not None,
        "not_learning": bigram_loss is not None and not_learning(rows, bigram_loss=bigram_loss),
        "collapsed": unigram_loss is not None and collapse_step(
            rows, warmup_steps=warmup_steps, unigram_loss=unigram_loss) is not None,
    }
    return [kind for kind in FAILURE_KINDS if found[kind]]


def row_failures(row: Mapping[str, Any]) -> list[str]:
    """The failure kinds of a report row (`report.summarise_run`, or a published summary.csv
    line): its `failures` field when it has one (";"-joined in a CSV), else the kinds read from
    the row's own fields by the same thresholds: status, spike and collapse steps, the final
    layer-mean normalised entropy (a CSV has no per-head rows, so the layer mean stands in) and
    the final bits per byte against the bigram baseline's."""
    recorded = row.get("failures")
    if isinstance(recorded, str):
        return [kind for kind in recorded.split(";") if kind]
    if isinstance(recorded, (list, tuple)):
        return list(recorded)
    entropy = _number(row.get("final_entropy_normalised"))
    final, bigram = _number(row.get("final_val_bpb")), _number(row.get("baseline_bigram_bpb"))
    found = {
        "diverged": row.get("status") == "diverged",
        "spiked": _number(row.get("spike_step")) is not None,
        "entropy_collapsed": _number(row.get("entropy_collapse_step")) is not None
        or (entropy is not None and entropy < ENTROPY_COLLAPSE),
        "not_learning": final is not None and bigram is not None and final >= bigram,
        "collapsed": _number(row.get("collapse_step")) is not None,
    }
    return [kind for kind in FAILURE_KINDS if found[kind]]


def failure_steps(rows: Sequence[Mapping[str, Any]], *, warmup_steps: int,
                  unigram_loss: float | None,
                  step_losses: Sequence[tuple[int, float]] | None = None,
                  summary: Mapping[str, Any] | None = None) -> dict[str, int | None]:
    """The first step of each failure that has one, for summary.json and the report:
    {"spike_step", "entropy_collapse_step", "collapse_step"} (None: not seen; the spike by
    `judged_spike_step`)."""
    return {
        "spike_step": judged_spike_step(rows, warmup_steps=warmup_steps,
                                        step_losses=step_losses, summary=summary),
        "entropy_collapse_step": entropy_collapse_step(rows, warmup_steps=warmup_steps),
        "collapse_step": None if unigram_loss is None else collapse_step(
            rows, warmup_steps=warmup_steps, unigram_loss=unigram_loss),
    }
