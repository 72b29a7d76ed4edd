r"""An independent GPT-2-style byte LM in PyTorch (CPU), trained on exactly the bytes and batches
`scale_ablation` trains on, to check the JAX model against a familiar reference.

    pip install -e '.[reference]'   # torch==2.13.0, CPU
    python -m benchmarks.reference_gpt2 --heads=1 --head_dim=256
    python -m benchmarks.reference_gpt2 --heads=1 --head_dim=256 --init=fan_in --no_attn_bias

The model is GPT-2's (Radford et al. 2019, as in nanoGPT): token and learned position embeddings,
pre-LayerNorm blocks of causal attention and a 4x GELU (tanh) MLP, a final LayerNorm and an output
tied to the token embedding; weights N(0, 0.02), the two residual output projections of each block
N(0, 0.02/sqrt(2·layers)), zero biases. head_dim is independent of d_model, as in scale_ablation.
Training matches `experiments/base.py`'s loop: AdamW (betas 0.9/0.95, eps 1e-8, decay on every
matrix and embedding, none on biases or norms), global-norm clipping, linear warmup from 0, cosine
to lr/10 at the last step; the batch for step s is `source.train_batch(s, ...)` and validation is
the mean loss over `source.val_batches(...)`, in nats per byte.

Bisection: `--init=fan_in` gives every matrix scale_ablation's default std 1/sqrt(fan_in) (the
token embedding too: nnx.Embed's default is 1/sqrt(d_model); that is its `fan_in` here); `--std GROUP=VALUE` then changes one
group (embed, qk, v, attn_out, mlp_in, mlp_out) to `gpt2`, `fan_in` or a number.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import torch
from torch import nn
from torch.nn import functional

from experiments import base
from scale_ablation.data import sources as data

GROUPS = ("embed", "qk", "v", "attn_out", "mlp_in", "mlp_out")
RESIDUAL_OUTPUTS = ("attn_out", "mlp_out")


def group_std(group: str, value: str, fan_in: int, num_layers: int) -> float:
    """The init std of one group: GPT-2's, 1/sqrt(fan_in), or a literal number."""
    if value == "gpt2":
        return 0.02 / math.sqrt(2 * num_layers) if group in RESIDUAL_OUTPUTS else 0.02
    if value == "fan_in":
        return 1.0 / math.sqrt(fan_in)
    return float(value)


class Block(nn.Module):
    def __init__(self, d_model: int, heads: int, head_dim: int, attn_bias: bool):
        super().__init__()
        inner = heads * head_dim
        self.heads, self.head_dim = heads, head_dim
        self.ln_1, self.ln_2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.q = nn.Linear(d_model, inner, bias=attn_bias)
        self.k = nn.Linear(d_model, inner, bias=attn_bias)
        self.v = nn.Linear(d_model, inner, bias=attn_bias)
        self.attn_out = nn.Linear(inner, d_model, bias=attn_bias)
        self.mlp_in = nn.Linear(d_model, 4 * d_model)
        self.mlp_out = nn.Linear(4 * d_model, d_model)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape

        def heads(y):  # (B, T, H*D) -> (B, H, T, D)
            return y.view(b, t, self.heads, self.head_dim).transpose(1, 2)

        q, k, v = heads(self.q(x)), heads(self.k(x)), heads(self.v(x))
        logits = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)  # (B, H, T, T)
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        probs = logits.masked_fill(~causal, float("-inf")).softmax(-1)
        return self.attn_out((probs @ v).transpose(1, 2).reshape(b, t, -1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.ln_1(x))
        return x + self.mlp_out(functional.gelu(self.mlp_in(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, args: argparse.Namespace):
        super().__init__()
        self.wte = nn.Embedding(256, args.d_model)
        self.wpe = nn.Embedding(args.seq_len, args.d_model)
        self.blocks = nn.ModuleList(
            Block(args.d_model, args.heads, args.head_dim, not args.no_attn_bias)
            for _ in range(args.layers)
        )
        self.ln_f = nn.LayerNorm(args.d_model)
        self._init(args)

    def _init(self, args: argparse.Namespace) -> None:
        stds = dict.fromkeys(GROUPS, args.init) | dict(s.split("=", 1) for s in args.std)
        embed_std = group_std("embed", stds["embed"], args.d_model, args.layers)
        nn.init.normal_(self.wte.weight, std=embed_std)
        nn.init.normal_(self.wpe.weight, std=0.02)  # scale_ablation's position init too
        for block in self.blocks:
            for group in GROUPS[1:]:
                for linear in (block.q, block.k) if group == "qk" else (getattr(block, group),):
                    std = group_std(group, stds[group], linear.in_features, args.layers)
                    nn.init.normal_(linear.weight, std=std)
                    if linear.bias is not None:
                        nn.init.zeros_(linear.bias)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.T  # tied output, (B, T, 256)


def lr_multiplier(step: int, steps: int, warmup: int) -> float:
    """Linear 0 -> 1 over `warmup` updates, then cosine from 1 to 0.1 at `steps`."""
    if step < warmup:
        return step / warmup
    progress = min(step - warmup, steps - warmup) / max(steps - warmup, 1)
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))


def optimizer(model: GPT, args: argparse.Namespace) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": args.wd}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8)


def as_tensors(batch: data.Batch) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.from_numpy(batch.inputs).long(), torch.from_numpy(batch.targets).long()


@torch.no_grad()
def validation_loss(model: GPT, batches: list[data.Batch]) -> float:
    """Mean next-byte loss in nats over every position of the fixed validation set."""
    total, count = 0.0, 0
    for batch in batches:
        inputs, targets = as_tensors(batch)
        logits = model(inputs)
        nll = functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum")
        total += nll.item()
        count += targets.numel()
    return total / count


def train(args: argparse.Namespace) -> dict:
    torch.manual_seed(args.seed)
    data_config = base.get_config().data
    data_config.seq_len = args.seq_len
    source = data.make_source(data_config, seed=args.data_seed)
    val = source.val_batches(args.batch, args.seq_len, args.val_batches)
    model = GPT(args)
    opt = optimizer(model, args)
    started = time.perf_counter()
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = args.lr * lr_multiplier(step, args.steps, args.warmup)
        inputs, targets = as_tensors(source.train_batch(step, args.batch, args.seq_len))
        loss = functional.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
    return {"heads": args.heads, "head_dim": args.head_dim, "init": args.init, "std": args.std,
            "attn_bias": not args.no_attn_bias, "seed": args.seed, "data_seed": args.data_seed,
            "final_train_loss": loss.item(),
            "val_loss": validation_loss(model, val), "seconds": time.perf_counter() - started}


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head_dim", type=int, default=64)
    p.add_argument("--d_model", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seq_len", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--wd", type=float, default=0.1)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--val_batches", type=int, default=4)  # experiments/base.py's data.val_batches
    p.add_argument("--seed", type=int, default=0, help="init seed")
    p.add_argument("--data_seed", type=int, default=0, help="batch order (train.seed)")
    p.add_argument("--init", choices=("gpt2", "fan_in"), default="gpt2")
    p.add_argument("--std", action="append", default=[], metavar="GROUP=VALUE",
                   help=f"one group's init ({', '.join(GROUPS)}): gpt2, fan_in or a number")
    p.add_argument("--no_attn_bias", action="store_true", help="attention without biases")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    for spec in args.std:
        group, _, value = spec.partition("=")
        if group not in GROUPS or not _valid_std(value):
            p.error(f"--std {spec!r}: want GROUP=VALUE, GROUP in {GROUPS}, VALUE gpt2|fan_in|num")
    for name in ("heads", "head_dim", "d_model", "layers", "seq_len", "batch", "steps"):
        if getattr(args, name) <= 0:
            p.error(f"--{name} must be positive, got {getattr(args, name)}")
    return args


def _valid_std(value: str) -> bool:
    if value in ("gpt2", "fan_in"):
        return True
    try:
        return float(value) >= 0
    except ValueError:
        return False


def main(argv: list[str]) -> None:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    print(json.dumps(train(args)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
