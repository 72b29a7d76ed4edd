"""u-μP (`model.parametrization=umup`, model/umup.py) against Graphcore's unit-scaling package
(0.3.5) as the oracle, on the same weights: our model's parameters (perturbed off their init, so
that norm gains and biases count) copied into a PyTorch model built from the package's own
modules and ops (uu.Embedding, uu.Linear, uu.LayerNorm / uu.RMSNorm, U.add, U.residual_split /
U.residual_add with the package's transformer_residual_scaling_rule, U.scaled_dot_product_
attention, U.gelu, uu.LinearReadout, uu.DepthModuleList), run in float64: the attention layer's
output, a block's output and the logits agree with ours; every parameter's gradient is the
package's up to one positive factor per tensor (what Adam's update cannot see but through ε); and
our optimiser's per-parameter LR and decay multipliers, measured on its updates, are those
unit-scaling's AdamW computes for the same parameters. Plus: each refusal is one line naming the
field. Under CI=true a missing unit_scaling fails (helpers.require)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import require, tiny_config

from scale_ablation.errors import ConfigError
from scale_ablation.model import umup
from scale_ablation.model.spec import ModelConfig
from scale_ablation.training import optim, run_config, run_setup, steps

UMUP = {"model.parametrization": "umup", "model.num_layers": 2}
# (overrides, the package's `mult` of the policy: None = its default). The policy s is u-μP's
# attention at mult = s·d_head; inv_dk (1/d_head) is the package's default.
CASES = [({"policy": "inv_dk"}, None),
         ({"policy": "inv_dk:4"}, 4.0),
         ({"policy": "inv_sqrt_dk", "model.norm": "rmsnorm", "model.num_layers": 3,
           "model.d_model": 64, "model.num_heads": 4}, math.sqrt(16))]
BATCH, SEQ = 2, 24


def built(config):
    """(our LanguageModel, {torch-style name: float64 array}) with every parameter moved off its
    init: weights × (1 + U(-0.2, 0.2)), norm gains and biases + N(0, 0.3²)."""
    graphdef, state = run_setup.init_state(config)
    lm = nnx.merge(graphdef, state["params"], state["rest"])
    params = nnx.state(lm, nnx.Param)
    leaves, tree = jax.tree_util.tree_flatten_with_path(params)
    keys = jax.random.split(jax.random.key(7), len(leaves))
    moved = [leaf + 0.3 * jax.random.normal(key, leaf.shape) if leaf.ndim == 1
             else leaf * (1 + jax.random.uniform(key, leaf.shape, minval=-0.2, maxval=0.2))
             for key, (_, leaf) in zip(keys, leaves, strict=True)]
    nnx.update(lm, jax.tree_util.tree_unflatten(tree, moved))
    names = {torch_name(jax.tree_util.keystr(path)): np.asarray(leaf, np.float64)
             for (path, _), leaf in zip(leaves, moved, strict=True)}
    return lm, names


def torch_name(keystr: str) -> str:
    """"['blocks'][0]['mlp_in']['kernel'].value" -> "blocks.0.mlp_in.weight"."""
    parts = keystr.removesuffix(".value").strip("[]'").replace("']['", ".").replace(
        "'][", ".").replace("]['", ".").split(".")
    rename = {"kernel": "weight", "embedding": "weight", "scale": "weight"}
    return ".".join(rename.get(part, part) for part in parts) + (
        ".weight" if parts == ["readout"] else "")


def package_norm(model: ModelConfig):
    uu = require("unit_scaling")
    if model.norm == "rmsnorm":
        return uu.RMSNorm(model.d_model, eps=1e-6, elementwise_affine=True)  # nnx's ε
    return uu.LayerNorm(model.d_model, eps=1e-6, elementwise_affine=True)


def package_block(model: ModelConfig, mult: float | None, index: int):
    """Block `index` of our pre-norm LM from unit_scaling's modules and ops: the package's
    residual split/add with its default rule's τ, its attention at `mult`, its GELU."""
    torch = require("torch")
    uu = require("unit_scaling")
    U = require("unit_scaling.functional")
    rule = require("unit_scaling.core.functional").transformer_residual_scaling_rule()
    d, heads, dk, layers = model.d_model, model.num_heads, model.head_dim, model.num_layers
    kwargs = {} if mult is None else {"mult": mult}

    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            for name, fan_out in (("query", heads * dk), ("key", heads * dk),
                                  ("value", heads * dk)):
                setattr(self, name, uu.Linear(d, fan_out))
            self.out = uu.Linear(heads * dk, d)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = (getattr(self, n)(x).view(b, t, heads, dk).transpose(1, 2)
                       for n in ("query", "key", "value"))
            out = U.scaled_dot_product_attention(q, k, v, is_causal=True, **kwargs)
            return self.out(out.transpose(1, 2).reshape(b, t, heads * dk))

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attention_norm, self.mlp_norm = package_norm(model), package_norm(model)
            self.attention = Attention()
            self.mlp_in = uu.Linear(d, model.mlp_ratio * d, bias=True)
            self.mlp_out = uu.Linear(model.mlp_ratio * d, d, bias=True)
            self.taus = rule(2 * index, 2 * layers), rule(2 * index + 1, 2 * layers)

        def forward(self, x):
            residual, skip = U.residual_split(x, self.taus[0])
            x = U.residual_add(self.attention(self.attention_norm(residual)), skip, self.taus[0])
            residual, skip = U.residual_split(x, self.taus[1])
            hidden = U.gelu(self.mlp_in(self.mlp_norm(residual)), approximate="tanh")
            return U.residual_add(self.mlp_out(hidden), skip, self.taus[1])

    return Block()


def oracle(model: ModelConfig, mult: float | None, names: dict[str, np.ndarray]):
    """The same LM from unit_scaling's modules and ops, float64, holding `names`' weights."""
    torch = require("torch")
    uu = require("unit_scaling")
    U = require("unit_scaling.functional")

    class LM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = uu.Embedding(model.vocab_size, model.d_model)
            self.position_embed = uu.Embedding(model.max_seq_len, model.d_model)
            self.blocks = uu.DepthModuleList([package_block(model, mult, i)
                                              for i in range(model.num_layers)])
            self.final_norm = package_norm(model)
            self.readout = uu.LinearReadout(model.d_model, model.vocab_size)

        def forward(self, tokens):
            x = U.add(self.embed(tokens), self.position_embed(torch.arange(tokens.shape[1])))
            for block in self.blocks:
                x = block(x)
            return self.readout(self.final_norm(x))

    lm = LM().double()
    torch_params = dict(lm.named_parameters())
    assert sorted(torch_params) == sorted(names)  # every parameter has its counterpart
    with torch.no_grad():
        for name, value in names.items():
            torch_params[name].copy_(torch.from_numpy(value.T if value.ndim == 2 and not
                                                      name.endswith("embed.weight") else value))
    return lm


@pytest.fixture(scope="module", params=range(len(CASES)), ids=["inv_dk", "inv_dk:4", "rms-L3"])
def pair(request):
    overrides, mult = CASES[request.param]
    config = tiny_config(**{**UMUP, "data.seq_len": SEQ, **overrides})
    model = run_config.validate(config)
    lm, names = built(config)
    return config, model, lm, oracle(model, mult, names)


def tokens_and_stream(model):
    rng = np.random.default_rng(3)
    tokens = rng.integers(0, model.vocab_size, (BATCH, SEQ))
    x = rng.normal(size=(BATCH, SEQ, model.d_model)).astype(np.float32)
    return tokens, x


def close(ours, theirs):
    theirs = theirs.detach().numpy()
    np.testing.assert_allclose(np.asarray(ours, np.float64), theirs, rtol=2e-5,
                               atol=2e-5 * np.abs(theirs).max())


def test_attention_output_is_the_packages(pair):
    torch = require("torch")
    _, model, lm, theirs = pair
    _, x = tokens_and_stream(model)
    for layer, block in enumerate(lm.blocks):
        ours, _ = block.attention(jnp.asarray(x))
        close(ours, theirs.blocks[layer].attention(torch.from_numpy(x).double()))


def test_block_output_is_the_packages(pair):
    torch = require("torch")
    _, model, lm, theirs = pair
    _, x = tokens_and_stream(model)
    for layer, block in enumerate(lm.blocks):
        close(block(jnp.asarray(x))[0], theirs.blocks[layer](torch.from_numpy(x).double()))


def test_logits_are_the_packages(pair):
    torch = require("torch")
    _, model, lm, theirs = pair
    tokens, _ = tokens_and_stream(model)
    close(lm(jnp.asarray(tokens))[0], theirs(torch.from_numpy(tokens)))


def test_gradients_are_the_packages_up_to_one_factor_per_tensor(pair):
    """The package's backward pass carries its own scales (scale_bwd); on the same loss each of
    our true gradients is its gradient times one positive number (cosine 1), which Adam's
    update, g/√(g²) per entry, does not see but through ε."""
    torch = require("torch")
    U = require("unit_scaling.functional")
    _, model, lm, theirs = pair
    tokens, _ = tokens_and_stream(model)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    graphdef, params, rest = nnx.split(lm, nnx.Param, ...)

    def loss(p):
        logits, _ = nnx.merge(graphdef, p, rest)(jnp.asarray(inputs))
        return steps.cross_entropy(logits, jnp.asarray(targets), jnp.ones(targets.shape), 0.0)[0]

    ours = {torch_name(jax.tree_util.keystr(path)): np.asarray(g, np.float64) for path, g in
            jax.tree_util.tree_leaves_with_path(jax.grad(loss)(params))}
    logits = theirs(torch.from_numpy(inputs))
    U.cross_entropy(logits.flatten(end_dim=-2), torch.from_numpy(targets).flatten()).backward()
    for name, param in theirs.named_parameters():
        theirs_grad = param.grad.numpy()
        mine = ours[name].T if ours[name].ndim == 2 and not name.endswith("embed.weight") \
            else ours[name]
        cosine = np.sum(mine * theirs_grad) / np.linalg.norm(mine) / np.linalg.norm(theirs_grad)
        assert cosine == pytest.approx(1.0, abs=1e-6), name


def measured_multipliers(config) -> dict[str, tuple[float, float | None]]:
    """Per parameter (Adam-step multiplier, decay multiplier or None where nothing decays) of our
    u-μP optimiser against plain AdamW's, on the same gradient (then on zero gradients, where
    the update is the decay alone)."""
    settings = optim.OptimizerSettings.of(config)
    params = run_setup.init_state(config)[1]["params"]
    grads = jax.tree.map(lambda p: jax.random.normal(jax.random.key(1), p.shape), params)
    out = []
    for g, decay in ((grads, 0.0), (jax.tree.map(jnp.zeros_like, grads), 0.1)):
        ours = optim.OptimizerSettings(10, 0, 0.0, decay,
                                       param_lr_multipliers=settings.param_lr_multipliers)
        plain = optim.OptimizerSettings(10, 0, 0.0, decay)
        a, b = (optim.make_optimizer(s).update(g, optim.make_optimizer(s).init(params), params)[0]
                for s in (ours, plain))
        out.append(jax.tree.map(lambda a, b: float(jnp.sum(a * b) / jnp.sum(b * b))
                                if float(jnp.sum(b * b)) else None, a, b))
    paths = [torch_name(jax.tree_util.keystr(p)) for p, _ in
             jax.tree_util.tree_leaves_with_path(params)]
    adam, decay = (jax.tree_util.tree_leaves(r, is_leaf=lambda x: x is None) for r in out)
    return dict(zip(paths, zip(adam, decay, strict=True), strict=True))


def test_lr_and_decay_multipliers_are_unit_scalings_adamw(pair):
    """uu.optim.AdamW (independent weight decay, its default) gives each parameter the group lr
    lr·scale and weight_decay wd/(lr·scale): a step decays every parameter by wd·p alike; ours
    decays every decayed parameter by lr·wd·p alike (the codebase's coupled decay, matrices and
    embeddings only), so both decay multipliers are 1 and the Adam steps' are the package's."""
    uu = require("unit_scaling")
    config, _, _, theirs = pair
    groups = uu.optim.AdamW(theirs.parameters(), lr=1.0, weight_decay=0.1).param_groups
    by_id = {id(p): (g["lr"], g["lr"] * g["weight_decay"] / 0.1) for g in groups
             for p in g["params"]}
    found = measured_multipliers(config)
    for name, param in theirs.named_parameters():
        lr, decay = by_id[id(param)]
        adam, our_decay = found[name]
        assert adam == pytest.approx(lr, rel=1e-5), name
        assert (our_decay is not None) == (param.ndim == 2), name
        if our_decay is not None:
            assert our_decay == pytest.approx(decay, rel=1e-5), name
    lrs = {round(by_id[id(p)][0], 6) for p in theirs.parameters()}
    assert len(lrs) >= 4  # not vacuous: fan-ins, the depth factor and the readout's 1 all differ


@pytest.mark.parametrize("d_k, mult, seq_len", [(16, 1.0, 24), (64, 1.0, 128), (16, 4.0, 2),
                                                (32, math.sqrt(32), 64), (8, 30.0, 16)])
def test_attention_output_multiplier_is_the_packages(d_k, mult, seq_len):
    """Ours against the package's, measured: U.scaled_dot_product_attention over torch's own at
    the same logit scale mult/d_k."""
    torch = require("torch")
    U = require("unit_scaling.functional")
    q, k, v = torch.randn(3, 1, 2, seq_len, d_k, dtype=torch.float64)
    plain = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                             scale=mult / d_k)
    scaled = U.scaled_dot_product_attention(q, k, v, is_causal=True, mult=mult)
    measured = float((scaled / plain).mean())
    assert float((scaled / plain).std()) < 1e-9  # one multiplier
    assert umup.attention_output_multiplier(mult / d_k, d_k, seq_len) == pytest.approx(
        measured, rel=1e-9)


def test_gelu_scale_is_the_packages():
    torch = require("torch")
    U = require("unit_scaling.functional")
    x = torch.randn(1000, dtype=torch.float64)
    ratio = U.gelu(x, approximate="tanh") / torch.nn.functional.gelu(x, approximate="tanh")
    assert float(ratio.mean()) == pytest.approx(umup.GELU_SCALE, rel=1e-9)


def test_umup_trains_and_sp_is_untouched():
    """A few steps at u-μP's scale of LR lower the loss; sp's optimiser has no multipliers."""
    config = tiny_config(**{**UMUP, "policy": "inv_dk", "train.lr": 0.5})
    graphdef, state = run_setup.init_state(config)
    step = jax.jit(steps.make_train_step(graphdef, optim.make_optimizer(config), 0.0))
    tokens = jnp.arange(64).reshape(2, 32) % 256
    batch = {"inputs": tokens, "targets": (tokens + 1) % 256, "weights": jnp.ones((2, 32))}
    losses = []
    for _ in range(6):
        state, metrics = step(state, batch, None)
        losses.append(float(metrics["train/loss"]))
    assert losses[-1] < losses[0] - 0.1, losses
    assert optim.OptimizerSettings.of(tiny_config()).param_lr_multipliers == ()


# --- every refusal of model/umup.py ------------------------------------------------------------

def model_config(**fields) -> ModelConfig:
    return ModelConfig(**{"d_model": 32, "num_layers": 1, "num_heads": 2, "head_dim": 16,
                          "layer_policies": ("inv_dk",), "parametrization": "umup", **fields})


@pytest.mark.parametrize("fields, says, value", [
    ({"norm_position": "post"}, "model.norm_position=pre", "'post'"),
    ({"init": "xavier"}, "model.init=fan_in", "'xavier'"),
    ({"init": "gpt2"}, "model.init=fan_in", "'gpt2'"),
    ({"init_gain": 2.0}, "model.init_gain=1", "2.0"),
    ({"depth_alpha": 0.5}, "model.depth_alpha off", "0.5"),
    ({"readout_zero_init": True}, "model.readout_zero_init=false", "True"),
    ({"qk_dim": 8}, "model.qk_dim=0", "8"),
    ({"attention_dropout": 0.1}, "model.attention_dropout=0", "0.1"),
    ({"layer_policies": ("learned",)}, "a policy that is a plain number", "'learned'"),
    ({"layer_policies": ("qk_layernorm",)}, "a policy that is a plain number", "'qk_layernorm'"),
    ({"layer_policies": ("softcap:30",)}, "a policy that is a plain number", "'softcap:30'"),
])
def test_each_refusal_is_one_line_naming_the_field_and_value(fields, says, value):
    with pytest.raises(ConfigError) as raised:
        model_config(**fields).check()
    message = str(raised.value)
    assert message.startswith("model.parametrization=umup needs") and says in message
    assert message.endswith(value) and "\n" not in message


@pytest.mark.parametrize("fields", [
    {}, {"qk_dim": 16}, {"norm": "rmsnorm", "positions": "rotary"},
    {"layer_policies": ("inv_sqrt_dk",)}, {"layer_policies": ("const:0.1",)},
    {"base_d_model": 8, "base_head_dim": 4},  # u-μP has no base: accepted, unused
    {"parametrization": "sp", "init": "gpt2", "norm_position": "post", "layer_policies": (
        "learned",)},  # the refusals are u-μP's alone
])
def test_the_edges_of_the_refusals_are_accepted(fields):
    assert model_config(**fields).check() is None


def test_a_parameter_without_a_rule_is_refused():
    with pytest.raises(ValueError, match="u-μP has no rule"):
        umup.lr_multiplier("['blocks'][0]['attention']['policy_params']['w'].value", (2, 3), 1)


def test_a_run_config_refusal_names_the_field():
    with pytest.raises(ConfigError, match=r"model\.parametrization=umup needs model\.init"):
        run_config.validate(tiny_config(**{**UMUP, "model.init": "gpt2"}))


def test_logit_sources_project_as_the_unit_scaled_layer_does(pair):
    """The logit decomposition (logit_sources.py) projects with the layer's weights outside its
    forward pass: u-μP's 1/√fan_in (and a bias's, here one off its init) must come along."""
    from scale_ablation.model import logit_sources
    _, model, lm, _ = pair
    _, x = tokens_and_stream(model)
    layer = lm.blocks[0].mlp_in  # a unit-scaled layer with a bias
    projected = logit_sources._project(jnp.asarray(x), logit_sources._weights(layer))
    np.testing.assert_allclose(projected, layer(jnp.asarray(x)), rtol=1e-5, atol=1e-5)
    assert umup.forward_multiplier(layer) == model.d_model ** -0.5
