"""Where the fused kernel cannot compute an attention (`attention.fused_unsupported_reason`),
`attend(implementation="fused")` falls back to the reference path: each reason, and the output
against a float64 NumPy attention. Plus a sink layer's learned logit in its diagnostics.

(tests/test_attention.py is at the 400-line limit; these are its fallbacks.)"""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from scale_ablation.model import attention, policies
from scale_ablation.model.spec import ModelConfig

F32 = jnp.dtype(jnp.float32)
BF16 = jnp.dtype(jnp.bfloat16)


def normal(seed, shape, dtype=jnp.float32):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


def numpy_attention(q, k, v, scale):
    """Causal softmax(scale · q·k) v in float64, [B, T, H, D] arrays (v's D may differ)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    logits = np.einsum("bqhd,bkhd->bhqk", q, k) * scale
    seq = q.shape[1]
    logits = np.where(np.tril(np.ones((seq, seq), bool)), logits, -np.inf)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    return np.einsum("bhqk,bkhd->bqhd", weights, v)


@pytest.mark.parametrize("case, reason", [
    ({"widths": (16, 8)}, "q/k width 16 differs from the value width 8"),
    ({"dropout": True}, "no attention dropout"),
    ({"precision": (BF16, F32)}, "activation dtype"),
    ({"precision": (F32, BF16)}, "activation dtype"),
    ({"policy": "softcap"}, "the policy cannot be fused"),
])
def test_each_reason_the_fused_kernel_is_refused(case, reason):
    fields = {"policy": "inv_sqrt_dk", "dtype": F32, "precision": (F32, F32), "dropout": False,
              "widths": (16, 16), **case}
    fields["policy"] = policies.get(fields["policy"])
    assert reason in attention.fused_unsupported_reason(**fields)
    # ... and with none of them, the kernel takes it.
    assert attention.fused_unsupported_reason(
        policies.get("inv_sqrt_dk"), dtype=F32, precision=(F32, F32), dropout=False,
        widths=(16, 16)) is None


def test_fused_with_a_narrower_value_falls_back_and_computes_the_attention():
    q, k = normal(0, (2, 8, 2, 16)), normal(1, (2, 8, 2, 16))
    v = normal(2, (2, 8, 2, 4))  # q/k width 16, value width 4: the kernel needs them equal
    out = attention.attend(q, k, v, policy=policies.get("inv_sqrt_dk"), implementation="fused")
    np.testing.assert_allclose(out, numpy_attention(q, k, v, 1 / 4), rtol=1e-5, atol=1e-5)


def test_fused_with_activation_dtype_logits_falls_back_to_the_reference_path():
    q, k, v = (normal(s, (1, 8, 2, 16), jnp.bfloat16) for s in range(3))
    fused = attention.attend(q, k, v, policy=policies.get("inv_sqrt_dk"), implementation="fused",
                             logits_dtype=None)
    reference = attention.attend(q, k, v, policy=policies.get("inv_sqrt_dk"),
                                 implementation="reference", logits_dtype=None)
    np.testing.assert_array_equal(np.asarray(fused, np.float32),
                                  np.asarray(reference, np.float32))


def test_a_sink_layer_reports_its_learned_logit():
    model = ModelConfig(d_model=32, num_layers=1, num_heads=2, head_dim=16,
                        layer_policies=("sink",))
    model.check()
    layer = attention.SelfAttention(model, policies.get("sink"), rngs=nnx.Rngs(0))
    _, stats = layer(normal(0, (1, 6, 32)), with_diagnostics=True)
    # The sink starts at logit 0 in every head (GPT-OSS's sinks, zero-initialised).
    np.testing.assert_array_equal(stats["learned_sink"], np.zeros(2))
