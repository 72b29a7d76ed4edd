"""Spike and collapse detection on synthetic metrics rows with known answers."""

from __future__ import annotations

import math

import pytest

from scale_ablation.analysis import instability


def rows(key: str, values: dict[int, float]) -> list[dict]:
    # Interleave rows without the key, as metrics.jsonl has (diagnostics-only rows).
    out = []
    for step, value in values.items():
        out.append({"step": step, key: value})
        out.append({"step": step, "attn/layer0/entropy": 1.0})
    return out


def test_no_spike_on_a_smooth_noisy_descent():
    smooth = {s: 5.0 * math.exp(-s / 30) + 2.0 + 0.05 * (-1) ** s for s in range(0, 100, 5)}
    assert instability.spike_step(rows("train/loss", smooth), warmup_steps=10) is None


def test_the_first_jump_above_factor_times_running_minimum_after_warmup():
    values = {0: 6.0, 5: 9.5, 10: 3.0, 15: 2.5, 20: 3.7, 25: 3.8, 30: 2.4}
    # Step 5 (9.5 > 1.5·6.0) is inside warmup; step 20: 3.7 < 1.5·2.5 = 3.75; step 25: 3.8 is.
    got = instability.spike_step(rows("train/loss", values), warmup_steps=10)
    assert got == 25
    assert instability.spike_step(rows("train/loss", values), warmup_steps=10, factor=1.4) == 20
    with pytest.raises(ValueError):
        instability.spike_step([], warmup_steps=0, factor=1.0)


def test_non_finite_losses_are_left_to_divergence():
    values = {0: 5.0, 20: 2.0, 30: math.nan, 40: math.inf, 50: 2.1}
    assert instability.spike_step(rows("train/loss", values), warmup_steps=10) is None


def test_collapse_at_the_unigram_loss_once_the_run_stops_improving():
    unigram = 3.3
    # Step 0 (5.5) is inside warmup; at 20 the run is still falling towards the baseline.
    values = {0: 5.5, 20: 3.6, 40: 3.40, 60: 3.30, 80: 3.31}
    got = instability.collapse_step(rows("val/loss", values), warmup_steps=10,
                                    unigram_loss=unigram)
    assert got == 80
    # A run that reaches the baseline from below (it learned, then lost it) collapses at once.
    values = {0: 5.5, 20: 2.9, 40: 3.28}
    assert instability.collapse_step(rows("val/loss", values), warmup_steps=10,
                                     unigram_loss=unigram) == 40  # 3.28 >= 0.99 · 3.3


def test_a_slow_run_above_the_baseline_is_not_collapsed():
    values = {0: 5.5, 20: 4.5, 40: 4.0, 60: 3.7, 80: 3.5}  # falling, all above 3.3
    assert instability.collapse_step(rows("val/loss", values), warmup_steps=10,
                                     unigram_loss=3.3) is None


def test_instability_steps_for_summary():
    metrics = rows("train/loss", {0: 5.0, 10: 3.0, 20: 6.0}) + rows("val/loss", {20: 3.5, 40: 3.5})
    metrics.sort(key=lambda r: r["step"])
    got = instability.instability_steps(metrics, warmup_steps=5, unigram_loss=3.4)
    assert got == {"spike_step": 20, "collapse_step": 40}
    got = instability.instability_steps(metrics, warmup_steps=5, unigram_loss=None)
    assert got == {"spike_step": 20, "collapse_step": None}


def test_a_solved_task_wobbling_near_zero_loss_does_not_spike():
    # MQAR at 99% recall: 0.02 -> 0.06 is three times the minimum but 0.04 nats; 0.02 -> 0.5
    # (the task forgotten in part) is a spike.
    calm = {0: 4.0, 20: 0.5, 40: 0.02, 60: 0.06, 80: 0.03}
    assert instability.spike_step(rows("train/loss", calm), warmup_steps=10) is None
    forgot = {**calm, 100: 0.5}
    assert instability.spike_step(rows("train/loss", forgot), warmup_steps=10) == 100
    # Without the floor the wobble at 60 is the spike: the floor is what tells them apart.
    assert instability.spike_step(rows("train/loss", calm), warmup_steps=10, min_rise=0.0) == 60
