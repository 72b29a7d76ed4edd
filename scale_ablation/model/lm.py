"""A small decoder-only byte-level language model in Flax NNX."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from scale_ablation.model import policies
from scale_ablation.model.attention import SelfAttention
from scale_ablation.model.initializers import gpt2_normal, kernel_init
from scale_ablation.model.policies import ScalePolicy
from scale_ablation.model.spec import ModelConfig


def make_norm(kind: str, d_model: int, dtype, rngs: nnx.Rngs) -> nnx.Module:
    if kind == "layernorm":
        return nnx.LayerNorm(d_model, dtype=dtype, rngs=rngs)
    return nnx.RMSNorm(d_model, dtype=dtype, rngs=rngs)  # ModelConfig.check allows these two


def embedding_init(init: str) -> dict:
    """nnx.Embed's initialiser for the token embedding (also the tied output): GPT-2's N(0, 0.02)
    under `gpt2`, else nnx's default N(0, 1/d_model)."""
    if init == "gpt2":
        return {"embedding_init": gpt2_normal()}
    return {}


class Block(nnx.Module):
    """Attention and a GELU MLP, each with a residual; norms before (pre) or after (post)."""

    def __init__(self, model: ModelConfig, policy: ScalePolicy, *, rngs: nnx.Rngs,
                 layer: int = 0):
        d_model, dtype = model.d_model, model.compute_dtype
        self.post_norm = model.norm_position == "post"
        self.attention_norm = make_norm(model.norm, d_model, dtype, rngs)
        # The layer's index: a policy's number may depend on it (`inv_layer`).
        self.attention = SelfAttention(model, policy, rngs=rngs, layer=layer)
        self.mlp_norm = make_norm(model.norm, d_model, dtype, rngs)
        hidden = model.mlp_ratio * d_model
        self.mlp_in = nnx.Linear(d_model, hidden, kernel_init=kernel_init(model.init),
                                 dtype=dtype, rngs=rngs)
        # The MLP output writes into the residual stream (GPT-2 scales it by depth).
        self.mlp_out = nnx.Linear(hidden, d_model, dtype=dtype, rngs=rngs, kernel_init=kernel_init(
            model.init, residual_layers=model.num_layers))

    def mlp(self, x: jax.Array) -> jax.Array:
        hidden = self.mlp_in(x)
        # GELU in float32: in float16 the tanh form's derivative takes 3z², which overflows
        # for |z| >= 148 and makes the gradient NaN (inf · sech² = inf · 0) while the loss stays
        # finite. A no-op for float32 compute.
        return self.mlp_out(jax.nn.gelu(hidden.astype(jnp.float32)).astype(hidden.dtype))

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

    def __init__(self, model: ModelConfig, *, rngs: nnx.Rngs):
        d_model, dtype = model.d_model, model.compute_dtype
        self.embed = nnx.Embed(model.vocab_size, d_model, dtype=dtype, rngs=rngs,
                               **embedding_init(model.init))
        self.position_embed = (
            nnx.Embed(model.max_seq_len, d_model, dtype=dtype, rngs=rngs,
                      embedding_init=jax.nn.initializers.normal(0.02))
            if model.positions == "learned" else None
        )
        self.blocks = nnx.List([Block(model, policies.get(spec), rngs=rngs, layer=layer)
                                for layer, spec in enumerate(model.layer_policies)])
        # Post-norm blocks already end in a norm; a pre-norm stack needs one before the output.
        self.final_norm = (make_norm(model.norm, d_model, dtype, rngs)
                           if model.norm_position == "pre" else None)

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


def build_model(model: ModelConfig, rngs: nnx.Rngs) -> LanguageModel:
    """The LanguageModel a ModelConfig describes (`ModelConfig.from_config` has checked it)."""
    return LanguageModel(model, rngs=rngs)
