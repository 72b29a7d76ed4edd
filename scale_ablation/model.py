"""A small decoder-only byte-level language model in Flax NNX."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from scale_ablation import policies
from scale_ablation.attention import SelfAttention, gpt2_normal, kernel_init
from scale_ablation.policies import ScalePolicy

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def make_norm(kind: str, d_model: int, dtype, rngs: nnx.Rngs) -> nnx.Module:
    if kind == "layernorm":
        return nnx.LayerNorm(d_model, dtype=dtype, rngs=rngs)
    if kind == "rmsnorm":
        return nnx.RMSNorm(d_model, dtype=dtype, rngs=rngs)
    raise ValueError(f"model.norm must be 'layernorm' or 'rmsnorm', got {kind!r}")


def embedding_init(init: str) -> dict:
    """nnx.Embed's initialiser for the token embedding (also the tied output): GPT-2's N(0, 0.02)
    under `gpt2`, else nnx's default N(0, 1/d_model)."""
    if init == "gpt2":
        return {"embedding_init": gpt2_normal()}
    return {}


class Block(nnx.Module):
    """Attention and a GELU MLP, each with a residual; norms before (pre) or after (post)."""

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        head_dim: int,
        *,
        policy: ScalePolicy,
        norm: str,
        norm_position: str,
        mlp_ratio: int,
        init: str,
        init_gain: float,
        attention_dropout: float,
        num_layers: int = 1,
        logits_dtype,
        attention_impl: str,
        rotary: bool,
        dtype,
        rngs: nnx.Rngs,
    ):
        if norm_position not in ("pre", "post"):
            raise ValueError(f"model.norm_position must be 'pre' or 'post', got {norm_position!r}")
        self.post_norm = norm_position == "post"
        self.attention_norm = make_norm(norm, d_model, dtype, rngs)
        self.attention = SelfAttention(
            d_model, num_heads, head_dim,
            policy=policy, rngs=rngs, init=init, qk_init_gain=init_gain, num_layers=num_layers,
            dropout_rate=attention_dropout,
            logits_dtype=logits_dtype, dtype=dtype, rotary=rotary, implementation=attention_impl,
        )
        self.mlp_norm = make_norm(norm, d_model, dtype, rngs)
        hidden = mlp_ratio * d_model
        self.mlp_in = nnx.Linear(d_model, hidden, kernel_init=kernel_init(init), dtype=dtype,
                                 rngs=rngs)
        self.mlp_out = nnx.Linear(hidden, d_model, dtype=dtype, rngs=rngs,
                                  kernel_init=kernel_init(init, residual_layers=num_layers))

    def mlp(self, x: jax.Array) -> jax.Array:
        return self.mlp_out(jax.nn.gelu(self.mlp_in(x)))

    def __call__(self, x, *, dropout_key=None, with_diagnostics=False):
        if self.post_norm:
            attended, stats = self.attention(x, dropout_key=dropout_key,
                                             with_diagnostics=with_diagnostics)
            x = self.attention_norm(x + attended)
            return self.mlp_norm(x + self.mlp(x)), stats
        attended, stats = self.attention(self.attention_norm(x), dropout_key=dropout_key,
                                         with_diagnostics=with_diagnostics)
        x = x + attended
        return x + self.mlp(self.mlp_norm(x)), stats


class LanguageModel(nnx.Module):
    """Byte embedding, learned or rotary positions, N blocks, final norm, tied output."""

    def __init__(
        self,
        *,
        vocab_size: int,
        d_model: int,
        num_layers: int,
        num_heads: int,
        head_dim: int,
        layer_policies: Sequence[ScalePolicy],
        norm: str = "layernorm",
        norm_position: str = "pre",
        positions: str = "learned",
        max_seq_len: int = 1024,
        mlp_ratio: int = 4,
        init: str = "fan_in",
        init_gain: float = 1.0,
        attention_dropout: float = 0.0,
        logits_dtype=jnp.float32,
        attention_impl: str = "reference",
        dtype=jnp.float32,
        rngs: nnx.Rngs,
    ):
        if positions not in ("learned", "rotary"):
            raise ValueError(f"model.positions must be 'learned' or 'rotary', got {positions!r}")
        if len(layer_policies) != num_layers:
            raise ValueError(f"{len(layer_policies)} layer policies for {num_layers} layers")
        self.dtype = dtype
        self.max_seq_len = max_seq_len
        self.embed = nnx.Embed(vocab_size, d_model, dtype=dtype, rngs=rngs,
                               **embedding_init(init))
        self.position_embed = (
            nnx.Embed(max_seq_len, d_model, dtype=dtype, rngs=rngs,
                      embedding_init=jax.nn.initializers.normal(0.02))
            if positions == "learned" else None
        )
        self.blocks = nnx.List([
            Block(
                d_model, num_heads, head_dim,
                policy=policy, norm=norm, norm_position=norm_position, mlp_ratio=mlp_ratio,
                init=init, init_gain=init_gain, attention_dropout=attention_dropout,
                num_layers=num_layers,
                logits_dtype=logits_dtype, attention_impl=attention_impl,
                rotary=positions == "rotary", dtype=dtype, rngs=rngs,
            )
            for policy in layer_policies
        ])
        # Post-norm blocks already end in a norm; a pre-norm stack needs one before the output.
        self.final_norm = make_norm(norm, d_model, dtype, rngs) if norm_position == "pre" else None

    def __call__(
        self,
        tokens: jax.Array,
        *,
        dropout_key: jax.Array | None = None,
        with_diagnostics: bool = False,
    ) -> tuple[jax.Array, list[dict[str, jax.Array]] | None]:
        """tokens [B, T] int -> (logits [B, T, vocab] float32, per-layer attention stats)."""
        seq_len = tokens.shape[1]
        x = self.embed(tokens)  # (B, T, C)
        if self.position_embed is not None:
            x = x + self.position_embed(jnp.arange(seq_len))[None]
        layer_keys = (
            jax.random.split(dropout_key, len(self.blocks)) if dropout_key is not None
            else [None] * len(self.blocks)
        )
        all_stats = []
        for block, key in zip(self.blocks, layer_keys, strict=True):
            x, stats = block(x, dropout_key=key, with_diagnostics=with_diagnostics)
            all_stats.append(stats)
        if self.final_norm is not None:
            x = self.final_norm(x)
        logits = self.embed.attend(x).astype(jnp.float32)  # (B, T, vocab)
        return logits, (all_stats if with_diagnostics else None)


def layer_policy_specs(config: ml_collections.ConfigDict) -> list[str]:
    """One policy spec per layer: `layer_policies` (comma-separated) if set, else `policy`."""
    num_layers = config.model.num_layers
    if config.get("layer_policies"):
        specs = [s.strip() for s in config.layer_policies.split(",")]
        if len(specs) != num_layers:
            raise ValueError(
                f"layer_policies lists {len(specs)} policies for model.num_layers={num_layers}"
            )
        return specs
    return [config.policy] * num_layers


def build_model(config: ml_collections.ConfigDict, rngs: nnx.Rngs, vocab_size: int = 256):
    """The LanguageModel a config describes (raises ValueError naming a bad field)."""
    m = config.model
    if m.head_dim <= 0 or m.num_heads <= 0 or m.d_model <= 0 or m.num_layers <= 0:
        raise ValueError("model.head_dim, num_heads, d_model and num_layers must be positive, "
                         f"got {m.head_dim}, {m.num_heads}, {m.d_model}, {m.num_layers}")
    if config.train.dtype not in DTYPES:
        raise ValueError(f"train.dtype must be one of {sorted(DTYPES)}, got {config.train.dtype!r}")
    if m.logits_dtype not in ("float32", "activation"):
        raise ValueError(f"model.logits_dtype must be 'float32' or 'activation', "
                         f"got {m.logits_dtype!r}")
    layer_policies = [policies.get(spec) for spec in layer_policy_specs(config)]
    return LanguageModel(
        vocab_size=vocab_size,
        d_model=m.d_model,
        num_layers=m.num_layers,
        num_heads=m.num_heads,
        head_dim=m.head_dim,
        layer_policies=layer_policies,
        norm=m.norm,
        norm_position=m.norm_position,
        positions=m.positions,
        max_seq_len=m.max_seq_len,
        mlp_ratio=m.mlp_ratio,
        init=m.init,
        init_gain=m.init_gain,
        attention_dropout=m.attention_dropout,
        logits_dtype=jnp.float32 if m.logits_dtype == "float32" else None,
        attention_impl=m.attention_impl,
        dtype=DTYPES[config.train.dtype],
        rngs=rngs,
    )
