"""Validation loss and attention diagnostics of a run's state, on its fixed validation batches."""

from __future__ import annotations

import math

import jax
import numpy as np

from scale_ablation import data as data_lib
from scale_ablation import steps
from scale_ablation.runs import PreparedRun, to_device_batch
from scale_ablation.steps import TrainState


class Evaluator:
    """The run's validation batches (at `data.seq_len` and each `train.eval_seq_lens`) and its
    shared eval and diagnostics programs."""

    def __init__(self, run: PreparedRun):
        config = run.config
        programs = steps.programs(run.graphdef, run.optimizer, float(config.train.z_loss))
        self._eval_step, self._diagnostics_step = programs.eval, programs.diagnostics

        def validation_set(seq_len: int) -> list[dict]:
            batches = run.source.val_batches(config.train.batch_size, seq_len,
                                             config.data.val_batches)
            # Every process builds the whole batch; each feeds only its own rows.
            share = (jax.process_index(), jax.process_count())
            return [to_device_batch(data_lib.process_share(b, *share), run.batch_sharding)
                    for b in batches]

        self.val_batches = validation_set(config.data.seq_len)
        # Longer validation sequences, for length generalisation: `val/loss@LEN`.
        self.longer_val = {n: validation_set(n) for n in config.train.get("eval_seq_lens", ())}

    def _mean_loss(self, state: TrainState, batches: list[dict]) -> tuple[float, float]:
        totals = np.zeros(3)  # summed loss, weight, correct predictions
        for batch in batches:
            totals += np.asarray(jax.device_get(self._eval_step(state, batch)), dtype=np.float64)
        return totals[0] / totals[1], totals[2] / totals[1]

    def evaluate(self, state: TrainState) -> dict[str, float]:
        """val/loss (nats per byte), val/bpb, val/accuracy, and the same @LEN per longer length."""
        row = {}
        for suffix, batches in [("", self.val_batches),
                                *((f"@{n}", b) for n, b in self.longer_val.items())]:
            loss, accuracy = self._mean_loss(state, batches)
            row.update({f"val/loss{suffix}": loss, f"val/bpb{suffix}": loss / math.log(2),
                        f"val/accuracy{suffix}": accuracy})
        return row

    def diagnose(self, state: TrainState) -> dict[str, float]:
        """Per-layer attention statistics on the first validation batch."""
        stats = jax.device_get(self._diagnostics_step(state, self.val_batches[0]))
        return {key: float(value) for key, value in stats.items()}
