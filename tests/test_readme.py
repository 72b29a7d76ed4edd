"""The README's "Adding a scale policy" section, followed to the letter."""

import pathlib
import re

import jax
import numpy as np

from scale_ablation import attention, policies

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def readme_policy_example() -> str:
    section = README.read_text().split("### Adding a scale policy", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


def test_the_readme_example_adds_a_working_policy():
    namespace: dict = {}
    exec(readme_policy_example(), namespace)  # the user's own file
    assert "inv_dk_pow" in policies.available()
    policy = policies.get("inv_dk_pow:0.75")
    q, k, v = jax.random.normal(jax.random.key(0), (3, 2, 8, 2, 16))
    # Against jax.nn.dot_product_attention with the scale the example promises: d_k ** -0.75.
    np.testing.assert_allclose(
        attention.attend(q, k, v, policy=policy),
        jax.nn.dot_product_attention(q, k, v, scale=16**-0.75, is_causal=True), atol=1e-5)
    # A scalar policy: it shares the compiled program of every other scalar policy.
    assert policy == policies.get("inv_sqrt_dk")
