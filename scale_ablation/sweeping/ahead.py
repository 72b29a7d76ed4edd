"""A sweep group's programs compiled while the previous group trains.

`Ahead.start(configs)` builds, in a background thread, the init program and the train step of
the runs that will train next as one group (`ensemble.group`), on stand-in states shaped and
placed as `run_setup.prepare` and the loop place theirs. The compiled programs land in jit's caches
and the persistent compilation cache, so the group starts without compiling them; on an
accelerator the host compiles while the device trains. A failure here only costs the head start:
the group compiles (and reports any error) when it starts.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import jax
import ml_collections
from absl import logging

from scale_ablation.model.spec import ModelConfig
from scale_ablation.training import run_setup, sharding
from scale_ablation.training.compile_log import AHEAD_THREAD
from scale_ablation.training.ensemble import MemberAxis


def _stand_in(config: ml_collections.ConfigDict,
              model: ModelConfig | None = None) -> run_setup.PreparedRun:
    """A fresh run's state, placed as `run_setup.prepare` places it; no data, no files. `model`:
    the config's ModelConfig, if the caller has it (a sweep's point has)."""
    mesh = sharding.make_mesh(config.train.get("fsdp", 1))
    graphdef, state = run_setup.init_state(config, model=model)
    state = jax.device_put(state, sharding.state_shardings(state, mesh))
    return run_setup.PreparedRun(config, "", None, graphdef, state, None,
                                 sharding.batch_sharding(mesh), None, None)


def compile_group(configs: Sequence[ml_collections.ConfigDict], pipelined: bool = True,
                  models: Sequence[ModelConfig | None] | None = None) -> None:
    """Compile the init program and the train step of `configs`, one ensemble group: the
    program of `train.steps_per_call` steps, the length most of its chunks have (others, near
    the steps where hooks read the state, compile when first used)."""
    models = [None] * len(configs) if models is None else models
    stand_ins = [_stand_in(config, model) for config, model in zip(configs, models, strict=True)]
    axis = MemberAxis(stand_ins, donate=not pipelined)
    axis.compile_step(axis.stack([run.state for run in stand_ins]),
                      configs[0].train.get("steps_per_call", 1))


class Ahead:
    """One background compilation at a time."""

    def __init__(self):
        self._thread: threading.Thread | None = None

    def start(self, configs: Sequence[ml_collections.ConfigDict],
              models: Sequence[ModelConfig] | None = None) -> None:
        self.wait()
        self._thread = threading.Thread(target=self._compile, args=(list(configs), models),
                                        name=AHEAD_THREAD, daemon=True)
        self._thread.start()

    @staticmethod
    def _compile(configs: list[ml_collections.ConfigDict],
                 models: Sequence[ModelConfig] | None) -> None:
        try:
            compile_group(configs, models=models)
        except Exception as error:  # the group compiles, and says what is wrong, when it starts
            logging.info("compiling ahead failed: %s: %s", type(error).__name__, error)

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
