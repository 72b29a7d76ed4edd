"""What a run records of what it consumed and what reproduces it, against counts done here."""

import os
import pathlib
import subprocess

import flax
import jax
import pytest

from scale_ablation.data import sources as data
from scale_ablation.training import experiment_files as experiment
from scale_ablation.training import hooks, provenance, train

REPO = pathlib.Path(__file__).resolve().parents[1]
QUICK = str(REPO / "experiments" / "base.py") + ":quick"
TINY = {
    "model.d_model": 32, "model.num_layers": 2, "model.num_heads": 2, "model.head_dim": 16,
    "model.max_seq_len": 64, "data.seq_len": 32, "data.val_batches": 1, "train.batch_size": 4,
    "train.steps": 6, "train.warmup_steps": 0, "train.log_every": 3, "train.eval_every": 6,
    "train.diag_every": 0, "checkpoint.every": 0, "wandb.mode": "disabled",
}


def tiny_config(**overrides):
    return experiment.apply_overrides(experiment.load_config(QUICK), {**TINY, **overrides})


def expected_parameters(d, layers, heads, d_k, vocab, max_seq, mlp_ratio) -> tuple[int, int]:
    """Counted from the architecture (fan_in init: no attention biases; the MLP has biases)."""
    attention = 4 * d * heads * d_k  # q, k, v, out
    mlp = d * mlp_ratio * d + mlp_ratio * d + mlp_ratio * d * d + d
    norms = 2 * 2 * d  # two LayerNorms (scale, bias) per block
    non_embedding = layers * (attention + mlp + norms) + 2 * d  # + the final LayerNorm
    return non_embedding + vocab * d + max_seq * d, non_embedding


def test_a_run_records_what_it_consumed(tmp_path):
    config = tiny_config()
    summary = train.train(config, tmp_path / "run")
    total, non_embedding = expected_parameters(32, 2, 2, 16, 256, 64, config.model.mlp_ratio)
    assert summary["parameters"] == total
    assert summary["non_embedding_parameters"] == non_embedding
    tokens = 6 * 4 * 32
    assert summary["tokens_seen"] == tokens
    train_size = data.make_source(config.data, seed=0).train.size
    assert summary["passes_over_data"] == pytest.approx(tokens / train_size)
    # 6 × weights per token (incl. the tied output matmul) + causal attention, 3 × 2 × T/2 × H·d_k
    # × 2 matmuls per layer.
    per_token = 6 * (non_embedding + 32 * 256) + 6 * 32 * 2 * 16 * 2
    assert summary["train_flops"] == pytest.approx(per_token * tokens)


def test_a_run_records_what_reproduces_it(tmp_path, monkeypatch):
    # The XLA flags the run's process was given (its backend has started: recorded, not used).
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_cpu_enable_fast_math=false".strip()
    monkeypatch.setenv("XLA_FLAGS", flags)
    summary = train.train(tiny_config(**{"train.steps": 2, "train.log_every": 1,
                                          "train.eval_every": 2, "train.warmup_steps": 0}), tmp_path / "run")
    environment = summary["environment"]
    assert environment["versions"]["jax"] == jax.__version__
    assert environment["versions"]["flax"] == flax.__version__
    assert environment["device_count"] == jax.device_count()
    assert environment["device_kind"] == jax.devices()[0].device_kind
    assert environment["xla_flags"] == flags
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=False)
    if head.returncode == 0:
        assert environment["git_commit"] == head.stdout.strip()
        assert isinstance(environment["git_dirty"], bool)


def test_repeated_data_is_a_warning(tmp_path, capsys):
    corpus = tmp_path / "small.txt"
    corpus.write_text("to be or not to be, that is the question. " * 40)  # ~1.7 kB
    config = tiny_config(**{"data.source": f"text:{corpus}", "train.steps": 20})
    summary = train.train(config, tmp_path / "run")
    assert summary["passes_over_data"] > 1
    out = capsys.readouterr().out
    assert "warning:" in out and f"{summary['passes_over_data']:.1f} passes" in out


def test_the_commit_is_read_as_training_starts(tmp_path, monkeypatch):
    """A checkout that moves while a run trains (a study resumed on a newer commit) does not
    relabel the code that ran: the run records the commit its process started training from."""
    checkout = {"git_commit": "a" * 40, "git_dirty": False}
    monkeypatch.setattr(provenance, "_git_state", lambda: dict(checkout))

    def move_checkout(member, tick):
        checkout["git_commit"] = "b" * 40

    summary = train.train(tiny_config(**{"train.steps": 4}), tmp_path / "run",
                          extra_hooks=[hooks.Periodic(1, move_checkout)])
    assert checkout["git_commit"] == "b" * 40  # the hook ran
    assert summary["environment"]["git_commit"] == "a" * 40
