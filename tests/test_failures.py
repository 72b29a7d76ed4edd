"""The failure taxonomy on synthetic metrics rows that show each failure, and a healthy run."""

from __future__ import annotations

import math

import numpy as np
import pytest

from scale_ablation.analysis import failures

WARMUP = 50
UNIGRAM = 4.7638 * math.log(2)  # nats per byte, as the LM experiments' baselines
BIGRAM = 3.5900 * math.log(2)
LAYERS, HEADS = 2, 4


def healthy_train(step: int) -> float:
    return 2.0 + 3.0 * math.exp(-step / 200)


def healthy_val(step: int) -> float:
    return 2.05 + 3.0 * math.exp(-step / 200)


def healthy_entropy(step: int, layer: int, head: int) -> float:
    return 0.95 - 0.4 * (1 - math.exp(-step / 300)) - 0.05 * head - 0.1 * layer


def run_rows(*, steps: int = 1000, noise: float = 0.03, seed: int = 0, train=healthy_train,
             val=healthy_val, entropy=healthy_entropy, per_head: bool = True) -> list[dict]:
    """Rows as the loop logs them: train metrics every 10 steps, evaluation and attention
    diagnostics every 100 (and at step 0), each step's metrics in one row."""
    rng = np.random.default_rng(seed)
    rows = []
    for step in range(0, steps + 1, 10):
        row: dict = {"step": step}
        if step:
            row["train/loss"] = train(step) + rng.normal(0, noise)
            row["train/grad_norm"] = 0.5
        if step % 100 == 0:
            row["val/loss"] = val(step)
            row["val/bpb"] = val(step) / math.log(2)
            for layer in range(LAYERS):
                heads = [entropy(step, layer, h) for h in range(HEADS)]
                row[f"attn/layer{layer}/entropy_normalised"] = float(np.mean(heads))
                row[f"attn/layer{layer}/entropy"] = 3.0  # not normalised: never read
                if per_head:
                    for h, value in enumerate(heads):
                        row[f"attn/layer{layer}/head{h}/entropy_normalised"] = value
        rows.append(row)
    return rows


def classify(rows, **kwargs):
    return failures.classify(rows, warmup_steps=WARMUP, unigram_loss=UNIGRAM,
                             bigram_loss=BIGRAM, **kwargs)


def test_a_healthy_run_trains_smoothly():
    rows = run_rows()
    assert classify(rows) == []
    assert failures.diverged_step(rows) is None
    assert failures.final_val_loss(rows) == pytest.approx(healthy_val(1000))


def test_the_kinds_and_their_meanings_are_stated_once():
    assert tuple(failures.FAILURE_MEANINGS) == failures.FAILURE_KINDS
    assert all(sentence and "\n" not in sentence for sentence in failures.FAILURE_MEANINGS.values())


# --- diverged ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("key", "value"), [("train/loss", math.nan), ("val/loss", math.inf),
                                            ("train/diverged", 1.0)])
def test_diverged_at_the_first_non_finite_loss_or_flag(key, value):
    rows = run_rows()
    rows[50][key] = value  # step 500
    rows[60]["train/loss"] = math.nan
    assert failures.diverged_step(rows) == 500
    assert classify(rows) == ["diverged"]


def test_diverged_from_the_status_alone():
    assert classify(run_rows(), status="diverged") == ["diverged"]
    assert classify(run_rows(), status="completed") == []


# --- spiked -----------------------------------------------------------------------------------

def series(values: dict[int, float] | list[float], start: int = 10) -> list[tuple[int, float]]:
    if isinstance(values, dict):
        return sorted(values.items())
    return [(start + 10 * i, v) for i, v in enumerate(values)]


def test_a_single_large_jump_is_a_spike_at_its_step():
    rows = run_rows()
    rows[60]["train/loss"] += 1.0  # step 600, on a loss of ~2.15 with noise 0.03
    assert failures.spike_step(failures.finite_series(rows, "train/loss"),
                               warmup_steps=WARMUP) == 600
    assert classify(rows) == ["spiked"]


@pytest.mark.parametrize("seed", range(5))
def test_a_slowly_decreasing_noisy_loss_is_not_spiked(seed):
    rng = np.random.default_rng(seed)
    steps = np.arange(10, 50_001, 10)
    losses = 2.0 + 1.5 * np.exp(-steps / 15_000) + rng.normal(0, 0.05, size=steps.size)
    assert failures.spike_step(list(zip(steps.tolist(), losses.tolist(), strict=True)),
                               warmup_steps=WARMUP) is None


def test_a_fast_smooth_descent_right_after_warmup_is_not_spiked():
    steps = range(10, 2001, 10)
    losses = [5.5 * math.exp(-s / 60) + 1.2 for s in steps]  # steep, noiseless
    assert failures.spike_step(series(dict(zip(steps, losses, strict=True))),
                               warmup_steps=WARMUP) is None


def test_a_jump_during_warmup_is_ignored():
    values = [5.0, 4.0, 3.6, 6.5, 3.4, 3.3] + [3.2 - 0.001 * i for i in range(50)]  # 6.5 at 40
    assert failures.spike_step(series(values), warmup_steps=WARMUP) is None
    assert failures.spike_step(series(values), warmup_steps=30) == 40


def test_a_solved_task_wobbling_between_0_02_and_0_06_is_not_spiked():
    rng = np.random.default_rng(1)
    values = [0.02 + 0.005 * rng.standard_normal() for _ in range(300)]
    for i in range(20, 300, 37):
        values[i] = 0.06  # three times the trend, ~8 noise units, but 0.04 nats
    assert failures.spike_step(series(values), warmup_steps=WARMUP) is None
    assert failures.spike_step(series(values), warmup_steps=WARMUP, min_rise=0.01) is not None


def test_the_bound_scales_with_the_run_s_own_noise():
    rng = np.random.default_rng(2)
    quiet = [2.0 + 0.01 * rng.standard_normal() for _ in range(200)]
    loud = [2.0 + 0.1 * rng.standard_normal() for _ in range(200)]
    for values in (quiet, loud):
        values[120] += 0.3  # step 1210
    assert failures.spike_step(series(quiet), warmup_steps=WARMUP) == 1210  # 30 noise units
    assert failures.spike_step(series(loud), warmup_steps=WARMUP) is None  # 3 noise units
    assert failures.step_noise(loud) == pytest.approx(0.1, rel=0.2)


def test_a_jump_that_stays_up_is_a_spike_at_its_first_step():
    values = [2.0 + 0.01 * (-1) ** i for i in range(100)] + [3.0] * 50
    assert failures.spike_step(series(values), warmup_steps=WARMUP) == 10 + 10 * 100


# --- entropy collapse ---------------------------------------------------------------------------

def collapsing_head(step: int, layer: int, head: int) -> float:
    if (layer, head) == (1, 2) and step >= 400:
        return 0.02  # one head of eight goes one-hot
    return healthy_entropy(step, layer, head)


def test_one_collapsed_head_is_found_at_its_first_diagnostics_step():
    rows = run_rows(entropy=collapsing_head)
    assert rows[40]["attn/layer1/entropy_normalised"] > failures.ENTROPY_COLLAPSE  # layer mean
    assert failures.entropy_collapse_step(rows, warmup_steps=WARMUP) == 400
    assert classify(rows) == ["entropy_collapsed"]


def test_without_per_head_keys_the_layer_means_are_judged():
    def layer_collapse(step, layer, head):
        return 0.01 if layer == 0 and step >= 700 else healthy_entropy(step, layer, head)

    rows = run_rows(entropy=layer_collapse, per_head=False)
    assert not any("head" in key for row in rows for key in row)
    assert failures.entropy_collapse_step(rows, warmup_steps=WARMUP) == 700
    assert failures.entropy_collapse_step(run_rows(entropy=collapsing_head, per_head=False),
                                          warmup_steps=WARMUP) is None


def test_low_entropy_during_warmup_does_not_count():
    rows = run_rows(entropy=lambda step, layer, head: 0.01 if step == 0 else 0.5)
    assert failures.entropy_collapse_step(rows, warmup_steps=WARMUP) is None
    assert failures.entropy_collapse_step(rows, warmup_steps=-1) == 0


# --- not learning and collapse -----------------------------------------------------------------

def test_a_final_loss_at_or_above_the_bigram_is_not_learning():
    rows = run_rows(val=lambda step: BIGRAM + 0.1 + 3.0 * math.exp(-step / 200))
    assert classify(rows) == ["not_learning"]
    rows[-1]["val/loss"] = BIGRAM  # at the baseline counts
    assert failures.not_learning(rows, bigram_loss=BIGRAM)
    rows[-1]["val/loss"] = BIGRAM - 1e-9
    assert not failures.not_learning(rows, bigram_loss=BIGRAM)


def test_returning_to_the_unigram_level_and_staying_is_collapse():
    def val(step):
        return healthy_val(step) if step < 500 else UNIGRAM - 0.005  # within 1%, flat

    rows = run_rows(val=val, train=lambda s: val(s) - 0.05 if s >= 500 else healthy_train(s))
    assert failures.collapse_step(rows, warmup_steps=WARMUP, unigram_loss=UNIGRAM) == 500
    assert classify(rows) == ["spiked", "not_learning", "collapsed"]


def test_descending_slowly_towards_the_unigram_level_is_not_collapse():
    rows = run_rows(val=lambda step: UNIGRAM + 1.0 - step / 1500)  # ends 0.33 above the unigram
    assert failures.collapse_step(rows, warmup_steps=WARMUP, unigram_loss=UNIGRAM) is None
    assert classify(rows) == ["not_learning"]


def test_without_baselines_their_rules_are_skipped():
    rows = run_rows(val=lambda step: UNIGRAM)  # flat at the unigram from the start
    assert failures.classify(rows, warmup_steps=WARMUP, unigram_loss=UNIGRAM,
                             bigram_loss=BIGRAM) == ["not_learning", "collapsed"]
    assert failures.classify(rows, warmup_steps=WARMUP, unigram_loss=None,
                             bigram_loss=None) == []


def test_several_failures_come_in_the_fixed_order():
    def val(step):
        return UNIGRAM if step >= 300 else healthy_val(step)

    rows = run_rows(val=val, entropy=collapsing_head,
                    train=lambda s: healthy_train(s) + (1.5 if s >= 300 else 0.0))
    rows[-1]["train/loss"] = math.nan
    assert classify(rows) == list(failures.FAILURE_KINDS)


def test_without_every_steps_loss_the_summary_leaves_the_spike_to_the_logged_rows():
    # No spike_step key: the loop's watch of the logged rows keeps the one it wrote.
    assert failures.summary_spike(None, warmup_steps=10) == {
        "spike_judged_on": failures.LOGGED_ROWS}


@pytest.mark.parametrize("recorded", [("spiked", "not_learning"), ["spiked", "not_learning"],
                                      "spiked;not_learning;"])
def test_a_rows_recorded_failures_are_taken_as_they_are(recorded):
    # A row that records its kinds (a list in memory, ";"-joined in a CSV) is not re-derived
    # from its fields, which here say diverged.
    row = {"failures": recorded, "status": "diverged", "spike_step": None}
    assert failures.row_failures(row) == ["spiked", "not_learning"]
    assert failures.row_failures({"status": "diverged", "spike_step": None}) == ["diverged"]
