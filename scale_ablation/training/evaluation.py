"""Validation loss and attention diagnostics of a run's state, on its fixed validation batches;
the test split's loss, once, at the end of a run.

Validation chooses (the best LR, when to stop: `analysis/optimum.py`, the report); the test set
(`data/heldout.py`) shares no window with it and reports. Its batches have the validation batches'
shapes, [train.batch_size, data.seq_len] and the same at each `train.eval_seq_lens`, so they run
in the same compiled eval programs.
"""

from __future__ import annotations

import math

import jax
import numpy as np
from flax import nnx

from scale_ablation.data import heldout
from scale_ablation.data import sources as data_lib
from scale_ablation.model import logit_sources
from scale_ablation.training import run_setup, steps
from scale_ablation.training.run_setup import PreparedRun, to_device_batch
from scale_ablation.training.steps import TrainState


class Evaluator:
    """The run's validation batches (at `data.seq_len` and each `train.eval_seq_lens`) and its
    shared eval and diagnostics programs."""

    def __init__(self, run: PreparedRun):
        config = run.config
        programs = steps.programs(run.graphdef, run.optimizer, float(config.train.z_loss))
        self._eval_step, self._diagnostics_step = programs.eval, programs.diagnostics
        self._logit_sources_step = programs.logit_sources
        # Only runs that diagnose read them (a resumed run rebuilds them: an init's cost).
        self.initial_qk = _initial_qk(run) if config.train.diag_every else None

        def on_device(batches: list[data_lib.Batch]) -> list[dict]:
            # Every process builds the whole batch; each feeds only its own rows.
            share = (jax.process_index(), jax.process_count())
            return [to_device_batch(data_lib.process_share(b, *share), run.batch_sharding)
                    for b in batches]

        batch_size, self.seq_len = config.train.batch_size, config.data.seq_len
        lengths = (self.seq_len, *config.train.get("eval_seq_lens", ()))
        validation = [(batch_size, n, config.data.val_batches) for n in lengths]
        self.val_batches = on_device(run.source.val_batches(*validation[0]))
        # Longer validation sequences, for length generalisation: `val/loss@LEN`.
        self.longer_val = {n: on_device(run.source.val_batches(*v))
                           for n, v in zip(lengths[1:], validation[1:], strict=True)}
        # Built now, so that a held-out text too small for it is said before training.
        self.test_windows_asked = heldout.window_count(config.data.get("test_bytes", 0),
                                                       self.seq_len)
        test = run.source.test_batches(batch_size, self.seq_len, self.test_windows_asked,
                                       avoid=validation)
        self.test_windows = int(sum((b.weights.sum(axis=1) > 0).sum() for b in test))
        self.test_batches = on_device(test)
        # The longer lengths' test sets, by the same rules (none where there is no test split),
        # so that the degradation beyond n is reported on bytes that chose nothing.
        test_bytes = config.data.get("test_bytes", 0) if self.test_batches else 0
        self.longer_test = {n: on_device(run.source.test_batches(
            batch_size, n, heldout.window_count(test_bytes, n), avoid=validation))
            for n in lengths[1:] if test_bytes}

    def _totals(self, state: TrainState, batches: list[dict]) -> np.ndarray:
        """(3, T): summed loss, weight and correct predictions per position over `batches`."""
        totals = 0.0
        for batch in batches:
            totals = totals + np.asarray(jax.device_get(self._eval_step(state, batch)),
                                         dtype=np.float64)
        return totals

    def evaluate(self, state: TrainState) -> dict[str, float]:
        """val/loss (nats per byte), val/bpb, val/accuracy; the same @LEN over every position
        of each longer length, and _beyond@LEN over its positions n..LEN-1 only (those the
        model never saw in training, n = data.seq_len), with val/bpb_degradation@LEN: the
        bits per byte beyond n minus those at n."""
        row = _scores("", self._totals(state, self.val_batches))
        return self._longer(state, row, self.longer_val, "val")

    def _longer(self, state: TrainState, row: dict, longer: dict, split: str) -> dict:
        """`row` with the scores of each longer length's batches in `longer` added."""
        n = self.seq_len
        for length, batches in longer.items():
            totals = self._totals(state, batches)
            row.update(_scores(f"@{length}", totals, split))
            if length > n and totals[1, n:].sum() > 0:
                row.update(_scores(f"_beyond@{length}", totals[:, n:], split))
                row[f"{split}/bpb_degradation@{length}"] = (row[f"{split}/bpb_beyond@{length}"]
                                                            - row[f"{split}/bpb"])
        return row

    def evaluate_test(self, state: TrainState) -> dict[str, float]:
        """test/loss, test/bpb, test/accuracy and test/targets (the weighted positions scored:
        bytes, or MQAR's queries) on the test split, and the longer lengths' scores as
        `evaluate` gives them; {} when the run has none."""
        if not self.test_batches:
            return {}
        totals = self._totals(state, self.test_batches)
        row = {**_scores("", totals, split="test"), "test/targets": int(totals[1].sum())}
        return self._longer(state, row, self.longer_test, "test")

    def diagnose(self, state: TrainState) -> dict[str, float]:
        """Per-layer attention statistics on the first validation batch, and where the logits
        come from (`model.logit_sources`: the initial q/k weights' part and the updates')."""
        batch = self.val_batches[0]
        stats = jax.device_get(self._diagnostics_step(state, batch))
        sources = jax.device_get(self._logit_sources_step(state, self.initial_qk, batch))
        return {key: float(value) for key, value in {**stats, **sources}.items()}


def _initial_qk(run: PreparedRun) -> logit_sources.InitialQK:
    """The run's q/k projection weights at step 0: the state's own for a new run; a resumed
    run's rebuilt from its seed (`run_setup.init_state` is deterministic), so that no
    checkpoint has to carry them."""
    state = run.state
    if int(state["step"]) != 0:
        _, state = run_setup.init_state(run.config, model=run.model)
    return logit_sources.initial_qk(nnx.merge(run.graphdef, state["params"], state["rest"]))


def _scores(suffix: str, totals: np.ndarray, split: str = "val") -> dict[str, float]:
    """Loss, bits per byte and accuracy from (3, T) per-position totals, over all T."""
    loss_sum, weight, correct = totals.sum(axis=1)
    loss = loss_sum / weight
    return {f"{split}/loss{suffix}": loss, f"{split}/bpb{suffix}": loss / math.log(2),
            f"{split}/accuracy{suffix}": correct / weight}
