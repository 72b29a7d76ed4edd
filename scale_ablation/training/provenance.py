"""What a run consumed and what reproduces it: parameters, tokens, passes over the data, FLOPs,
package versions, the git commit and the devices. Written into summary.json and W&B."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
from typing import Any

import jax
import ml_collections
import numpy as np

from scale_ablation.model.spec import ModelConfig
from scale_ablation.training import run_config

PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy")
EMBEDDINGS = ("embed", "position_embed")  # top-level modules whose parameters are tables


def parameter_counts(params: Any) -> dict[str, int]:
    """{"parameters", "non_embedding_parameters"} of an nnx params state (a nested mapping)."""
    total = embedding = 0
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        size = int(np.prod(leaf.shape))
        total += size
        if getattr(path[0], "key", None) in EMBEDDINGS:
            embedding += size
    return {"parameters": total, "non_embedding_parameters": total - embedding}


def flops_per_token(model: ModelConfig, non_embedding_parameters: int, seq_len: int) -> float:
    """Training FLOPs per token: 3 × the forward pass (backward ≈ 2 × forward), where the forward
    is 2 × every matmul weight (the non-embedding parameters plus the tied output projection,
    d_model × vocab) plus causal attention's q·k and weights·v, 2 × 2 × (T/2) × H·d_k per layer
    (each query sees T/2 keys on average)."""
    matmul = non_embedding_parameters + model.d_model * model.vocab_size
    attention = 2 * seq_len * model.num_heads * model.head_dim * model.num_layers
    return 3.0 * (2.0 * matmul + attention)


def consumption(config: ml_collections.ConfigDict, counts: dict[str, int], steps: int,
                train_tokens: int | None, model: ModelConfig | None = None) -> dict[str, Any]:
    """Tokens seen, passes over the training split (None for generated data) and FLOPs after
    `steps` steps, with the parameter counts. `model`: the config's ModelConfig, if the caller
    has it (`runs.PreparedRun.model`)."""
    model = run_config.model_config(config) if model is None else model
    tokens = steps * config.train.batch_size * config.data.seq_len
    per_token = flops_per_token(model, counts["non_embedding_parameters"], config.data.seq_len)
    return {**counts, "tokens_seen": tokens,
            "passes_over_data": tokens / train_tokens if train_tokens else None,
            "train_flops": per_token * tokens}


def train_tokens(source: Any) -> int | None:
    """Size of the training split in tokens (bytes); None for a generator (MQAR) and for a
    streamed corpus whose size is unknown (`hf_data`: `train_bytes`, from the dataset card)."""
    if hasattr(source, "train_bytes"):
        return source.train_bytes
    train = getattr(source, "train", None)
    return int(train.size) if train is not None else None


def environment() -> dict[str, Any]:
    """Package versions, the git commit (and whether the tree had changes), the devices and
    the XLA flags they ran under (a sweep's arrangement may add some: `--process_xla_flags`)."""
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    device = jax.devices()[0]
    # The host's CPUs too: on a CPU the device is the host, and its speed is their number's.
    return {"versions": versions, **_git_state(), "device_kind": device.device_kind,
            "device_count": jax.device_count(), "process_count": jax.process_count(),
            "host_cpus": _host_cpus(), "xla_flags": os.environ.get("XLA_FLAGS", "")}


def _host_cpus() -> int | None:
    """The CPUs this process may run on (all of the host's where the OS cannot say: macOS)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count()


def _git_state() -> dict[str, Any]:
    """The checkout this package runs from: commit and dirty flag (None outside git)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", root, *args], capture_output=True, text=True,
                                  timeout=10, check=True)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"git_commit": commit.strip() if commit else None,
            "git_dirty": bool(status.strip()) if status is not None else None}
