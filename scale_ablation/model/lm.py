"""A small decoder-only byte-level language model in Flax NNX.

Under `model.parametrization=mup` the token embedding's std, the readout's multiplier and the
init of other output weights follow μP's rules (`scale_ablation.model.parametrization`); under
`sp` none is touched. Under `umup` (u-μP, `scale_ablation.model.umup`) the linear layers,
embeddings, GELU, residual joins and the untied readout are unit-scaled. Under `model.depth_alpha` (CompleteP, `scale_ablation.model.depth`) each
residual branch is multiplied by (L/L_base)^-α before it joins the stream; off, nothing is.
`LanguageModel.coordinates` gives the mean |activation| of each family a coordinate check
follows (`scale_ablation.training.coordinates`).

The residual stream's dtype (`ModelConfig.stream_dtype`) is the compute dtype unless
`model.residual_dtype = "float32"`: then, as mixed precision is usually practised (PyTorch's
autocast; Flax's `dtype` of a module as its computation's), the embedding lookup, the stream,
every norm and every residual addition stay float32, and each sublayer's input is cast to the
compute dtype at the block boundary, where its matmuls run; its output is cast back before it
is added. The readout's matmul runs in the compute dtype either way.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from scale_ablation.model import depth, parametrization, policies, umup
from scale_ablation.model.attention import SelfAttention
from scale_ablation.model.initializers import gpt2_normal, kernel_init
from scale_ablation.model.policies import ScalePolicy
from scale_ablation.model.spec import ModelConfig


def make_norm(kind: str, d_model: int, dtype, rngs: nnx.Rngs) -> nnx.Module:
    if kind == "layernorm":
        return nnx.LayerNorm(d_model, dtype=dtype, rngs=rngs)
    return nnx.RMSNorm(d_model, dtype=dtype, rngs=rngs)  # ModelConfig.check allows these two


def embedding_init(model: ModelConfig) -> dict:
    """nnx.Embed's initialiser for the token embedding (also the tied output): GPT-2's N(0, 0.02)
    under `gpt2`, else nnx's default N(0, 1/d_model); under μP N(0, 1/base_d_model), the base
    model's at every width (a vector-like parameter); under u-μP N(0, 1)."""
    if umup.is_on(model):
        return {"embedding_init": umup.unit_init()}
    if model.init == "gpt2":
        return {"embedding_init": gpt2_normal()}
    if parametrization.is_mup(model):
        scale = parametrization.embedding_variance_scale(model)
        return {"embedding_init": jax.nn.initializers.variance_scaling(
            scale, "fan_in", "normal", out_axis=0)}  # nnx's default, times `scale`
    return {}


# Mean |x| over every entry: the coordinate size a coordinate check follows (mup's
# `get_coord_data` records x.abs().mean() of each module's output).
def mean_abs(x: jax.Array) -> jax.Array:
    return jnp.abs(x.astype(jnp.float32)).mean()


class Block(nnx.Module):
    """Attention and a GELU MLP, each with a residual; norms before (pre) or after (post)."""

    def __init__(self, model: ModelConfig, policy: ScalePolicy, *, rngs: nnx.Rngs,
                 layer: int = 0):
        d_model, dtype, stream = model.d_model, model.compute_dtype, model.stream_dtype
        self.post_norm = model.norm_position == "post"
        self.compute_dtype = dtype  # each sublayer's input is cast to it (the module docstring)
        # (skip, branch) multipliers of the attention and the MLP branch as they join the stream:
        # u-μP's, or CompleteP's m_L^-α on both branches (static; all 1 when both are off).
        self.residual_weights = (umup.residual_weights(model, layer) if umup.is_on(model) else
                                 ((1.0, depth.residual_multiplier(model)),) * 2)
        self.gelu_scale = umup.GELU_SCALE if umup.is_on(model) else 1.0
        self.attention_norm = make_norm(model.norm, d_model, stream, rngs)
        # The layer's index: a policy's number may depend on it (`inv_layer`).
        self.attention = SelfAttention(model, policy, rngs=rngs, layer=layer)
        self.mlp_norm = make_norm(model.norm, d_model, stream, rngs)
        hidden = model.mlp_ratio * d_model
        self.mlp_in = umup.linear(model, d_model, hidden, kernel_init(model.init), rngs=rngs)
        # The MLP output writes into the residual stream (GPT-2 scales it by depth).
        self.mlp_out = umup.linear(model, hidden, d_model, rngs=rngs, kernel_init=kernel_init(
            model.init, residual_layers=model.num_layers))

    def mlp(self, x: jax.Array) -> jax.Array:
        hidden = self.mlp_in(x)
        # GELU in float32: in float16 the tanh form's derivative takes 3z², which overflows
        # for |z| >= 148 and makes the gradient NaN (inf · sech² = inf · 0) while the loss stays
        # finite. A no-op for float32 compute. u-μP's unit-scaled GELU: × umup.GELU_SCALE.
        activated = jax.nn.gelu(hidden.astype(jnp.float32))
        if self.gelu_scale != 1.0:
            activated = activated * self.gelu_scale
        return self.mlp_out(activated.astype(hidden.dtype))

    def __call__(self, x, *, dropout_key=None, with_diagnostics=False, coords=None,
                 sow_max_logit=False):
        """coords: None, or a dict whose lists get this block's mean |attention output| and
        |MLP output| appended (`LanguageModel.coordinates`); sow_max_logit: see `Attention`."""
        def record(name: str, value: jax.Array) -> None:
            if coords is not None:
                coords[name].append(mean_abs(value))

        # The block boundary: sublayers compute in the compute dtype, the stream keeps its own
        # (both casts are no-ops when the two are one dtype).
        def attention(h):
            out, stats = self.attention(h.astype(self.compute_dtype), dropout_key=dropout_key,
                                        with_diagnostics=with_diagnostics,
                                        sow_max_logit=sow_max_logit)
            return out.astype(h.dtype), stats

        def mlp(h):
            return self.mlp(h.astype(self.compute_dtype)).astype(h.dtype)

        if self.post_norm:
            attended, stats = attention(x)
            x = self.attention_norm(x + attended)
            mlp_out = mlp(x)
            record("attn_output", attended), record("mlp_output", mlp_out)
            return self.mlp_norm(x + mlp_out), stats
        attended, stats = attention(self.attention_norm(x))
        x = self.join(x, attended, 0)
        mlp_out = mlp(self.mlp_norm(x))
        # The branches' own outputs, before CompleteP's or u-μP's multipliers (nanoGPT-mup's hooks
        # on the attention and MLP modules record the same).
        record("attn_output", attended), record("mlp_output", mlp_out)
        return self.join(x, mlp_out, 1), stats

    def join(self, x: jax.Array, out: jax.Array, branch: int) -> jax.Array:
        """The stream x after residual branch `branch` (0: attention, 1: MLP) joins it:
        skip·x + weight·out, (1, m_L^-α) under CompleteP, u-μP's (1, τ)/√(1 + τ²) under u-μP
        (pre-norm only, `depth.check`, `umup.check`); a multiplier of 1 is no operation."""
        skip, weight = self.residual_weights[branch]
        x = x if skip == 1.0 else x * skip
        return x + (out if weight == 1.0 else out * weight)


class LanguageModel(nnx.Module):
    """Byte embedding, learned or rotary positions, N blocks, final norm, tied output."""

    def __init__(self, model: ModelConfig, *, rngs: nnx.Rngs):
        d_model, dtype = model.d_model, model.stream_dtype  # the stream starts in its dtype
        self.compute_dtype = model.compute_dtype  # the readout's matmul
        self.embed = nnx.Embed(model.vocab_size, d_model, dtype=dtype, rngs=rngs,
                               **embedding_init(model))
        position_init = umup.unit_init() if umup.is_on(model) else jax.nn.initializers.normal(0.02)
        self.position_embed = (
            nnx.Embed(model.max_seq_len, d_model, dtype=dtype, rngs=rngs,
                      embedding_init=position_init)
            if model.positions == "learned" else None
        )
        # u-μP's unit-scaled add of the two embeddings (1: the plain sum).
        self.embedding_sum = umup.EMBEDDING_SUM if umup.is_on(model) else 1.0
        self.blocks = nnx.List([Block(model, policies.get(spec), rngs=rngs, layer=layer)
                                for layer, spec in enumerate(model.layer_policies)])
        # Post-norm blocks already end in a norm; a pre-norm stack needs one before the output.
        self.final_norm = (make_norm(model.norm, d_model, dtype, rngs)
                           if model.norm_position == "pre" else None)
        # μP's zero-initialised readout (mup's MuReadout(readout_zero_init=True)) and u-μP's
        # N(0, 1) one (its LinearReadout) cannot be the embedding: untied, [d_model, vocab].
        self.readout = self.untied_readout(model, rngs)
        self.readout_multiplier = (umup.readout_multiplier(model) if umup.is_on(model) else
                                   parametrization.readout_multiplier(model))  # 1 under sp

    @staticmethod
    def untied_readout(model: ModelConfig, rngs: nnx.Rngs) -> nnx.Param | None:
        shape = (model.d_model, model.vocab_size)
        if umup.is_on(model):
            return nnx.Param(umup.unit_init()(rngs.params(), shape, jnp.float32))
        return nnx.Param(jnp.zeros(shape, jnp.float32)) if model.readout_zero_init else None

    def __call__(
        self,
        tokens: jax.Array,
        *,
        dropout_key: jax.Array | None = None,
        with_diagnostics: bool = False,
        sow_max_logit: bool = False,
    ) -> tuple[jax.Array, list[dict[str, jax.Array]] | None]:
        """tokens [B, T] int -> (logits [B, T, vocab] float32, per-layer attention stats).
        sow_max_logit: QK-clip layers sow their largest logit per head, for a caller inside
        `nnx.capture` (`qk_clip.forward`)."""
        logits, all_stats = self._forward(tokens, dropout_key, with_diagnostics, None,
                                          sow_max_logit)
        return logits, (all_stats if with_diagnostics else None)

    def coordinates(self, tokens: jax.Array) -> dict[str, jax.Array]:
        """Mean |x| of each activation family (scalars; the per-layer ones averaged over the
        layers): `embedding` (token embedding output), `attn_logits` (after the scale, over
        the keys each query sees), `attn_output`, `mlp_output`, `residual` (the stream after
        the last block) and `output_logits`."""
        coords: dict[str, list] = {"attn_output": [], "mlp_output": []}
        logits, all_stats = self._forward(tokens, None, True, coords)
        families = {name: jnp.mean(jnp.stack(values)) for name, values in coords.items()
                    if isinstance(values, list)}
        logit_sizes = jnp.stack([stats["mean_abs_logit"].mean() for stats in all_stats])
        return {"embedding": coords["embedding"], "attn_logits": logit_sizes.mean(), **families,
                "residual": coords["residual"], "output_logits": mean_abs(logits)}

    def _forward(self, tokens, dropout_key, with_diagnostics, coords, sow_max_logit=False):
        seq_len = tokens.shape[1]
        x = self.embed(tokens)  # (B, T, C)
        if coords is not None:
            coords["embedding"] = mean_abs(x)
        if self.position_embed is not None:
            x = x + self.position_embed(jnp.arange(seq_len))[None]
            x = x if self.embedding_sum == 1.0 else x * self.embedding_sum
        layer_keys = (
            jax.random.split(dropout_key, len(self.blocks)) if dropout_key is not None
            else [None] * len(self.blocks)
        )
        all_stats = []
        for block, key in zip(self.blocks, layer_keys, strict=True):
            x, stats = block(x, dropout_key=key, with_diagnostics=with_diagnostics, coords=coords,
                             sow_max_logit=sow_max_logit)
            all_stats.append(stats)
        if coords is not None:
            coords["residual"] = mean_abs(x)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return self.readout_logits(x), all_stats

    def readout_logits(self, x: jax.Array) -> jax.Array:
        """x [B, T, C] -> logits [B, T, vocab] float32: the tied embedding (or the untied
        readout), its input times μP's 1/m_d (mup's MuReadout.forward) or u-μP's 1/d_model."""
        x = x.astype(self.compute_dtype)  # a float32 stream meets the readout's matmul dtype
        if self.readout_multiplier != 1.0:
            x = x * self.readout_multiplier
        if self.readout is not None:
            return jnp.dot(x, self.readout[...].astype(x.dtype)).astype(jnp.float32)
        # nnx.Embed.attend's product, in the compute dtype whatever the lookup's dtype.
        embedding = self.embed.embedding[...].astype(x.dtype)  # (vocab, C)
        return jnp.dot(x, embedding.T).astype(jnp.float32)  # (B, T, vocab)
