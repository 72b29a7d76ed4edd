r"""The benchmark step's breakdown (`benchmarks.profile_step`) under each attention path:
`python -m benchmarks.profile_blocked [--impls=reference,blocked] [--reps=3] [--json F.json]`.

One process, the paths one after another (each its own compilations), the matmul peak and
/proc/loadavg recorded with each: the cores here are shared, and a loaded machine moves every
number, so compare the paths within one file, not across files.
"""

from __future__ import annotations

import json
import sys

from absl import app, flags

from benchmarks import profile_step
from benchmarks import run as bench

_IMPLS = flags.DEFINE_list("impls", ["reference", "blocked"], "model.attention_impl values.")
_REPS = flags.DEFINE_integer("reps", 3, "Timed repetitions of each part.")
_SEQ = flags.DEFINE_integer("seq", 256, "Sequence length of the benchmark config.")
_OUT = flags.DEFINE_string("json", None, "Write the results as JSON here (--out is run.py's).")


def _loadavg() -> str:
    with open("/proc/loadavg") as f:
        return f.read().strip()


def main(argv) -> int:
    del argv
    out = {"command": "python -m benchmarks.profile_blocked " + " ".join(sys.argv[1:]),
           "config": "benchmarks.run.benchmark_config() (d_model 256, 4 layers, 4 x 64, batch 16)",
           "seq": _SEQ.value, "by_impl": {}}
    for impl in _IMPLS.value:
        config = bench.benchmark_config()
        config.model.attention_impl, config.data.seq_len = impl, _SEQ.value
        config.model.max_seq_len = max(config.model.max_seq_len, _SEQ.value)
        load = _loadavg()
        result = profile_step.breakdown(config, reps=_REPS.value)
        result["loadavg_before"], result["loadavg_after"] = load, _loadavg()
        out["by_impl"][impl] = result
        parts = "  ".join(f"{name} {p['seconds_per_step'] * 1e3:.0f} ms"
                          for name, p in result["parts"].items())
        print(f"{impl}: step {result['step_seconds'] * 1e3:.0f} ms, peak "
              f"{result['matmul_peak_gflops']:.0f} GFLOP/s; {parts}; load {load}", flush=True)
    if _OUT.value:
        with open(_OUT.value, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    app.run(main)
