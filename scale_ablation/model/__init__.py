"""The model: scale policies, attention, the LM and its initialisation, diagnostics.

Which module registers which built-in scale policy, by name (`policies.register`; the names are
the specs of `--config.policy`, each described in docs/policies.md). `tests/test_policy_index.py`
checks this list against the registry, so a policy added, renamed or moved must be listed here:

    policies: inv_sqrt_dk, none, inv_dk, inv_log_dk, const, gain_aware, learned,
        learned_per_head
    policy_library: qk_layernorm, qk_rmsnorm, qk_rmsnorm_nogain, qk_layernorm_global, cosine,
        log_length, temperature, yarn, inv_sqrt_head_width, inv_layer, logit_layernorm
    stabilisers: softcap, sigmoid, sink, qk_clip
    scale_family: c_inv_sqrt_dk
    parametrization: mup_inv_dk

`compose` registers no name: it makes `A+B` of any two. Policies of your own: `plugins`.
"""
