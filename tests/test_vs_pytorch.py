"""benchmarks/vs_pytorch.py (issue 33): the PyTorch model it times computes our model's function
at the benchmark's shape given our weights, its fused attention equals the reference masked
softmax, and a tiny side-by-side run reports both sides per sequence, alternating, with ratios
that follow from its per-round records."""

import json
import math
import os
import statistics
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import copy_into_reference, require

torch = require("torch")  # the PyTorch side

from benchmarks import reference_gpt2, vs_pytorch  # noqa: E402
from benchmarks import run as bench  # noqa: E402
from scale_ablation.model.build import build_model  # noqa: E402
from scale_ablation.training import run_config  # noqa: E402


def test_the_timed_pytorch_model_computes_ours_given_our_weights():
    config = bench.benchmark_config(tiny=True)
    model = build_model(run_config.model_config(config), nnx.Rngs(params=0))
    # Every parameter moved off its init (non-zero biases, norms != 1), so each placement counts.
    state = nnx.state(model, nnx.Param)
    leaves, treedef = jax.tree.flatten(state)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    nnx.update(model, jax.tree.unflatten(treedef, [
        x + 0.1 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys, strict=True)]))
    reference, _, _ = vs_pytorch.torch_model(vs_pytorch.shape_of(config))
    assert sum(p.numel() for p in reference.parameters()) == sum(x.size for x in leaves)
    copy_into_reference(model, reference)
    tokens = np.random.default_rng(2).integers(0, 256, size=(2, config.data.seq_len + 1))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]  # (B, T) each
    ours = np.asarray(model(jnp.asarray(inputs))[0])  # (B, T, 256)
    with torch.no_grad():
        theirs = reference(torch.from_numpy(inputs).long())
        their_loss = torch.nn.functional.cross_entropy(
            theirs.flatten(0, 1), torch.from_numpy(targets).long().flatten()).item()
    assert np.abs(ours).max() > 1.0  # logits of a real size, not a degenerate match
    np.testing.assert_allclose(ours, theirs.numpy(), rtol=1e-4, atol=1e-4)
    log_probs = ours - jax.nn.logsumexp(ours, axis=-1, keepdims=True)
    our_loss = -np.take_along_axis(np.asarray(log_probs), targets[..., None], -1).mean()
    assert their_loss == pytest.approx(float(our_loss), rel=1e-5)


def test_fused_attention_equals_the_masked_softmax():
    shape = vs_pytorch.shape_of(bench.benchmark_config(tiny=True))
    model, _, sdpa_block = vs_pytorch.torch_model(shape)
    block = model.blocks[0]
    x = torch.randn(3, 40, shape["d_model"], generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        fused = block.attention(x)
        masked = reference_gpt2.Block.attention(block, x)  # the unfused original, same weights
    assert isinstance(block, sdpa_block)
    assert float(masked.abs().max()) > 1e-3
    torch.testing.assert_close(fused, masked, rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # four processes, 1-3 min on 2 cores; the function itself is compared above
def test_tiny_side_by_side_run(tmp_path):
    out = tmp_path / "vs.json"
    # A compilation cache shared by the JAX processes: the second round loads its program
    # (compile time is outside the timed steps either way; this only keeps the test short).
    env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "cache"),
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
           "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}
    subprocess.run([sys.executable, "-m", "benchmarks.vs_pytorch", "--tiny", "--seqs=32",
                    "--rounds=2", "--reps=2", "--impls=reference", "--threads=1",
                    f"--out={out}"], check=True, capture_output=True, timeout=240, env=env)
    results = json.loads(out.read_text())
    assert set(results["seqs"]) == {"32"}  # one length: each is four processes (~9 s each)
    for seq, entry in results["seqs"].items():
        records = entry["records"]
        # Alternating: jax then torch in round 0, the other way round in round 1.
        assert [(r["round"], r["side"]) for r in records] == [
            (0, "jax"), (0, "torch"), (1, "torch"), (1, "jax")]
        for r in records:
            assert r["seq"] == int(seq) and math.isfinite(r["step_s"]) and r["step_s"] > 0
            assert math.isfinite(r["loss_step0"]) and 0 < r["mfu"] < 1.5
        step = {side: statistics.median(r["step_s"] for r in records if r["side"] == side)
                for side in ("jax", "torch")}
        summary = entry["summary"]
        assert summary["torch:sdpa"]["step_ms"] == pytest.approx(1e3 * step["torch"])
        assert summary["jax:reference"]["ratio_to_torch"] == pytest.approx(
            step["jax"] / step["torch"])
        # The same FLOP formula on both sides: equal N gives equal FLOPs per token.
        assert len({r["num_params"] for r in records}) == 1
        assert len({r["flops_per_token"] for r in records}) == 1


@pytest.mark.parametrize("flag,words", [("--impls=dense", "--impls"), ("--rounds=0", "--rounds"),
                                        ("--seqs=2048", "max_seq_len")])
def test_bad_input_is_one_line_and_exit_2(flag, words, tmp_path):
    out = tmp_path / "never.json"
    done = subprocess.run([sys.executable, "-m", "benchmarks.vs_pytorch", flag, f"--out={out}"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and words in done.stderr
    assert not out.exists()
