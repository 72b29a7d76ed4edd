"""Mutation testing of the core: apply each listed bug to a copy of the repo, run the tests that
should catch it, and report which mutations the tests kill.

    python benchmarks/mutation.py                    # every mutation (~9 minutes on 2 cores)
    python benchmarks/mutation.py --only rotary,bpb  # mutations whose name contains a word
    python benchmarks/mutation.py --list             # the list, nothing run
    python benchmarks/mutation.py --tier fast        # only each selection's fast-tier tests

`--tier fast` keeps each mutation's tests to those not marked slow (`-m "not slow"`, the fast
tier): run once with it and once without, the two counts are how much of what the full suite
kills the fast tier kills. A mutation whose tests are all slow is "survived (no fast test)" there.

Each mutation is a realistic bug: a file, an exact snippet of it, its replacement, and the tests
(pytest arguments: files, node ids, `-k` expressions) that must fail. Every snippet is checked,
before anything runs, to occur exactly once. The repo is copied once to a temporary directory
(PYTHONPATH and the working directory point at the copy, so the copy is what is imported, also
by the subprocesses the tests start). First each test selection runs there unmutated and must
pass (a test that fails anyway proves nothing); then each mutation is written there, its tests
run with `-x`, and the file is restored.

Exit status: 0 when every mutation is killed, 1 when one survives, 2 when a snippet is missing
or ambiguous (the code moved: update the list) or a selection fails unmutated.

Why not mutmut or cosmic-ray: they generate thousands of operator-level mutants (`+` to `-`,
constants off by one), most of them equivalent or caught by any test at all, and each needs a
test run of seconds to minutes here (JAX compiles); the suite takes ~6 minutes, so even a
few hundred mutants is hours. A short list of the bugs that matter for this project's
results, each paired with the tests that should catch it, runs in minutes and says exactly
which guarantee broke.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
# Not copied: environments, caches and outputs.
IGNORED = (".git", ".venv", ".jax_cache", "__pycache__", ".pytest_cache", ".ruff_cache",
           "results", "runs", "wandb", "*.egg-info")


@dataclasses.dataclass(frozen=True)
class Mutation:
    name: str
    area: str
    why: str  # the bug, in words
    edits: tuple[tuple[str, str, str], ...]  # (file, exact original snippet, replacement)
    tests: tuple[str, ...]  # pytest arguments selecting the tests that should kill it


def mutation(name: str, area: str, why: str, file: str, original: str, replacement: str,
             *tests: str) -> Mutation:
    return Mutation(name, area, why, ((file, original, replacement),), tests)


ATT, POL, MODEL = "scale_ablation/model/attention.py", "scale_ablation/model/policies.py", "scale_ablation/model/lm.py"
INIT = "scale_ablation/model/initializers.py"
STEPS, OPTIM, DATA = "scale_ablation/training/steps.py", "scale_ablation/training/optim.py", "scale_ablation/data/sources.py"
SHARD = "scale_ablation/training/sharding.py"
FSDP_OFF = (SHARD, "        if fsdp > 1:\n", "        if False:\n")
BATCH_REPLICATED = (SHARD, 'return NamedSharding(mesh, P(("data", "fsdp")))',
                    "return NamedSharding(mesh, P())")
INSPECT = ("tests/test_sharding.py", "-k", "inspection")

MUTATIONS = [
    # --------------------------------------------------------------- policies
    mutation("inv_sqrt_dk_is_inv_dk", "policies", "1/√d_k computed as 1/d_k", POL,
             "scalar(lambda head_dim: 1.0 / math.sqrt(head_dim))",
             "scalar(lambda head_dim: 1.0 / head_dim)",
             "tests/test_attention.py", "-k", "inv_sqrt_dk_is_jax"),
    mutation("learned_scale_not_exponentiated", "policies",
             "a learned scale used in log space (exp forgotten)", POL,
             'return jnp.exp(params["log_scale"])  # [] or [heads]',
             'return params["log_scale"]  # [] or [heads]',
             "tests/test_attention.py", "-k", "closed_form"),
    mutation("log_length_log1p", "policies", "log_length uses log(1 + n) instead of log n",
             "scale_ablation/model/policy_library.py",
             "jnp.log(ctx.num_keys)[:, None]", "jnp.log1p(ctx.num_keys)[:, None]",
             "tests/test_attention.py", "-k", "closed_form"),
    # --------------------------------------------------------------- attention
    mutation("log_length_ignores_key_offset", "attention",
             "keys per query ignore k_len - q_len (wrong when q_len < k_len)", ATT,
             "q_len + 1, dtype=jnp.float32) + (k_len - q_len)", "q_len + 1, dtype=jnp.float32)",
             "tests/test_attention.py", "-k", "keys_per_query or closed_form"),
    mutation("causal_mask_aligned_at_start", "attention",
             "the causal mask puts query 0 on key 0 when q_len < k_len", ATT,
             "k=k_len - q_len)", "k=0)",
             "tests/test_attention.py", "-k", "causal_mask or closed_form"),
    mutation("fused_scales_twice", "attention",
             "the fused kernel applies its own 1/√d on top of the folded-in scale", ATT,
             "q_scaled, k, v, scale=1.0, is_causal=causal,", "q_scaled, k, v, is_causal=causal,",
             "tests/test_attention.py", "-k", "closed_form"),
    mutation("rotary_on_q_only", "attention", "rotary applied to the queries only", ATT,
             "q, k = apply_rotary(q, positions), apply_rotary(k, positions)",
             "q = apply_rotary(q, positions)",
             "tests/test_attention.py", "-k", "rotary"),
    # --------------------------------------------------------------- model
    mutation("xavier_is_fan_in", "model", "model.init=xavier initialises fan_in", INIT,
             'variance_scaling(gain**2, "fan_avg", "normal")',
             'variance_scaling(gain**2, "fan_in", "normal")',
             "tests/test_model.py", "-k", "init_gain"),
    mutation("init_gain_on_values", "model", "the q/k init gain also scales v and out", ATT,
             "kernel_init(model.init, model.init_gain), kernel_init(model.init)",
             "kernel_init(model.init, model.init_gain), kernel_init(model.init, model.init_gain)",
             "tests/test_model.py", "-k", "init_gain"),
    mutation("model_not_causal", "model", "the model's attention sees future tokens", ATT,
             "            causal=True,\n", "            causal=False,\n",
             "tests/test_model.py", "-k", "causal"),
    # --------------------------------------------------------------- train step
    mutation("diverged_state_not_frozen", "train step",
             "a non-finite step still updates the state", STEPS,
             "new_state = jax.tree.map(lambda new, old: jnp.where(finite, new, old), new_state, "
             "state)", "new_state = new_state",
             "tests/test_steps.py", "-k", "non_finite or diverged"),
    mutation("dropout_key_of_next_step", "train step",
             "the loop's step draws the dropout key of the step after its own", STEPS,
             'dropout_key(seed, state["step"]))', 'dropout_key(seed, state["step"] + 1))',
             "tests/test_steps.py", "-k", "seeded"),
    mutation("chunk_resumes_after_non_finite", "train step",
             "a chunk of steps trains on after a non-finite step inside it", STEPS,
             "healthy = healthy & (metrics[finite] > 0)", "healthy = metrics[finite] > 0",
             "tests/test_steps.py", "-k", "chunk"),
    mutation("sweep_line_cuts_chunks", "train step",
             "the sweep's progress hook claims to read the state: every chunk is one step",
             "scale_ablation/sweeping/progress.py", "after_step_work=True, reads_state=False)",
             "after_step_work=True)", "tests/test_loop.py", "-k", "only_hooks"),
    mutation("lr_not_applied", "train step", "the state's peak learning rate is ignored", STEPS,
             'lambda u: u * state["lr"]', "lambda u: u",
             "tests/test_steps.py", "-k", "state_lr"),
    mutation("z_loss_unweighted", "train step", "z-loss averaged over padded positions too",
             STEPS, "z_loss * ((log_z**2) * weights).sum() / total_weight",
             "z_loss * (log_z**2).mean()",
             "tests/test_steps.py", "-k", "cross_entropy"),
    # --------------------------------------------------------------- evaluation
    mutation("bpb_in_nats", "evaluation", "bits per byte reported in nats",
             "scale_ablation/training/evaluation.py", 'f"{split}/bpb{suffix}": loss / math.log(2)',
             'f"{split}/bpb{suffix}": loss', "tests/test_steps.py", "-k", "bpb"),
    mutation("train_bpb_in_nats", "evaluation", "the logged train/bpb is the loss in nats",
             "scale_ablation/training/hooks.py", 'row["train/bpb"] = row["train/loss"] / math.log(2)',
             'row["train/bpb"] = row["train/loss"]',
             "tests/test_report.py", "-k", "one_csv_row"),
    mutation("accuracy_unweighted", "evaluation", "eval accuracy counts unweighted positions",
             STEPS, '((logits.argmax(-1) == batch["targets"]) * weights).sum(0)',
             '(logits.argmax(-1) == batch["targets"]).sum(0)',
             "tests/test_steps.py", "-k", "accuracy"),
    # --------------------------------------------------------------- optimiser
    mutation("decay_everything", "optimiser",
             "weight decay on biases, norm gains and policy parameters too", OPTIM,
             "lambda p: p.ndim >= 2", "lambda p: True",
             "tests/test_optim.py", "-k", "decay"),
    mutation("cosine_to_zero", "optimiser", "the cosine schedule decays to 0, not 0.1", OPTIM,
             "alpha=0.1", "alpha=0.0", "tests/test_optim.py", "-k", "schedule"),
    mutation("no_clipping", "optimiser", "gradient clipping never applied", OPTIM,
             "    if settings.grad_clip > 0:\n", "    if False:\n",
             "tests/test_optim.py", "-k", "adamw"),
    mutation("adam_b2", "optimiser", "Adam's b2 at the library default 0.999, not 0.95", OPTIM,
             "b2=0.95", "b2=0.999", "tests/test_optim.py", "-k", "adamw"),
    # --------------------------------------------------------------- data
    mutation("targets_not_shifted", "data", "text targets are the inputs, not the next bytes",
             "scale_ablation/data/windows.py", "        targets=windows[:, 1:],\n",
             "        targets=windows[:, :-1],\n",
             "tests/test_data.py", "-k", "shifted_by_one"),
    mutation("mqar_weights_off_by_one", "data",
             "MQAR scores the position after the queried key", DATA,
             "weights[rows, query_pos] = 1.0", "weights[rows, query_pos + 1] = 1.0",
             "tests/test_mqar.py", "-k", "each_key_queried"),
    mutation("mqar_answer_revealed", "data",
             "MQAR writes each answer into the input after its query", DATA,
             "        targets = np.full((B, seq_len), self.FILLER, np.int32)\n",
             "        inputs[rows, query_pos + 1] = values\n"
             "        targets = np.full((B, seq_len), self.FILLER, np.int32)\n",
             "tests/test_mqar.py", "-k", "never_appear"),
    mutation("mqar_queries_in_pair_order", "data",
             "MQAR gives the i-th query-slot draw to the i-th pair (query order leaks the pair)",
             DATA, "2 * np.take_along_axis(drawn, deal, axis=1)", "2 * drawn",
             "tests/test_mqar.py", "-k", "query_order"),
    mutation("recall_unweighted", "data", "recall accuracy counts every position", DATA,
             "hits = (np.asarray(predictions) == batch.targets) * batch.weights",
             "hits = (np.asarray(predictions) == batch.targets) * 1.0",
             "tests/test_data.py", "-k", "recall_accuracy"),
    # --------------------------------------------------------------- report
    mutation("lr_sensitivity_uncapped", "report",
             "LR sensitivity does not cap a loss at the initial loss",
             "scale_ablation/analysis/comparisons.py", "None if value is None else min(value, loss_init)",
             "None if value is None else value", "tests/test_report.py", "-k", "wortsman"),
    mutation("spike_without_floor", "report",
             "a solved task's wobble near zero loss counts as a spike",
             "scale_ablation/analysis/failures.py", "bound = max(noise_factor * noise, min_rise)",
             "bound = noise_factor * noise", "tests/test_failures.py", "-k", "solved"),
    mutation("edge_kept_on_secondary_metric", "report",
             "an edge on a metric the LRs were not chosen on keeps the primary metric's decisions",
             "scale_ablation/analysis/comparisons.py", "same_metric=b.chosen_on == key)",
             "same_metric=True)", "tests/test_claims_field.py", "-k", "another_metric"),
    mutation("band_judged_at_an_edge_lr", "report",
             "a learned scale at a best LR on the grid's edge is judged against the band",
             "scale_ablation/analysis/verdict_bands.py", "        elif at_edge:\n            place = cmp.AT_EDGE\n",
             "", "tests/test_claims_rules.py", "-k", "edge"),
    # --------------------------------------------------------------- sharding
    mutation("no_fsdp", "sharding", "train.fsdp > 1 leaves every parameter replicated",
             *FSDP_OFF, *INSPECT),
    mutation("batch_replicated", "sharding", "every device gets the whole batch",
             *BATCH_REPLICATED, *INSPECT),
    Mutation("eight_copies", "sharding",
             "both at once: the 8-device run is 8 copies of a 1-device run",
             (FSDP_OFF, BATCH_REPLICATED), INSPECT),
    # --------------------------------------------------------------- checkpoints
    mutation("adam_moments_not_saved", "checkpoints",
             "checkpoints hold zeroed Adam moments: a resumed run restarts them",
             "scale_ablation/records/checkpoints.py", "args=ocp.args.StandardSave(state))",
             'args=ocp.args.StandardSave({**state, "opt_state": jax.tree.map('
             'jax.numpy.zeros_like, state["opt_state"])}))',
             "tests/test_train.py", "-k", "sigterm_is_bitwise"),
]


def check_snippets(mutations: list[Mutation]) -> list[str]:
    """One line per snippet that does not occur exactly once in its file."""
    problems = []
    for m in mutations:
        for file, original, _ in m.edits:
            count = (REPO / file).read_text().count(original)
            if count != 1:
                problems.append(f"{m.name}: {file}: the original snippet occurs {count} times: "
                                f"{original!r}")
    return problems


TIER_MARKERS = {"full": (), "fast": ("-m", "not slow")}
NO_TESTS = 5  # pytest's exit status when the selection collects nothing


def pytest(copy: pathlib.Path, tests: tuple[str, ...], timeout: float):
    """pytest -x on `tests` (the tier's marker expression included) in the copy, importing the
    copy's package."""
    env = {**os.environ, "PYTHONPATH": str(copy), "WANDB_MODE": "offline",
           "WANDB_SILENT": "true", "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                           *tests], cwd=copy, env=env, capture_output=True, text=True,
                          timeout=timeout)


def failing_baselines(copy: pathlib.Path, mutations: list[Mutation], timeout: float) -> list[str]:
    """The test selections that do not pass on the unmutated copy: a mutation "killed" by a
    test that fails anyway proves nothing."""
    selections = list(dict.fromkeys(m.tests for m in mutations))
    failing = []
    for index, tests in enumerate(selections, 1):
        start = time.monotonic()
        result = pytest(copy, tests, timeout)
        print(f"[baseline {index}/{len(selections)}] rc {result.returncode} "
              f"{time.monotonic() - start:6.1f} s  {' '.join(tests)}", flush=True)
        if result.returncode not in (0, NO_TESTS):  # a selection with no fast test is no failure
            failing.append(f"{' '.join(tests)}: pytest exited {result.returncode}\n"
                           f"{result.stdout[-1500:]}")
    return failing


def run_tests(copy: pathlib.Path, mutation: Mutation, timeout: float) -> tuple[str, float]:
    """('killed' | 'survived' | 'killed (timeout)', seconds) with the mutation applied."""
    originals = {file: (copy / file).read_text() for file, _, _ in mutation.edits}
    for file, original, replacement in mutation.edits:
        path = copy / file
        path.write_text(path.read_text().replace(original, replacement, 1))
    start = time.monotonic()
    try:
        result = pytest(copy, mutation.tests, timeout)
        # pytest: 1 a test failed, 5 no test collected (a bad selection is not a kill).
        outcome = {0: "survived", 1: "killed", NO_TESTS: "survived (no test)"}.get(
            result.returncode)
        if outcome is None:
            raise RuntimeError(f"{mutation.name}: pytest exited {result.returncode}:\n"
                               f"{result.stdout[-2000:]}{result.stderr[-2000:]}")
    except subprocess.TimeoutExpired:
        outcome = "killed (timeout)"
    finally:
        for file, text in originals.items():
            (copy / file).write_text(text)
    return outcome, time.monotonic() - start


def imported_from(copy: pathlib.Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(copy)}
    return subprocess.run([sys.executable, "-c", "import scale_ablation; "
                           "print(scale_ablation.__file__)"], cwd=copy, env=env,
                          capture_output=True, text=True, check=True).stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated words: run the mutations "
                        "whose name contains one of them")
    parser.add_argument("--list", action="store_true", help="print the mutations and exit")
    parser.add_argument("--no_baseline", action="store_true", help="skip the first pass that "
                        "runs each test selection on the unmutated copy (it must pass)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per mutation")
    parser.add_argument("--tier", choices=sorted(TIER_MARKERS), default="full",
                        help="fast: only the tests of each selection not marked slow")
    args = parser.parse_args(argv)
    words = [w for w in args.only.split(",") if w]
    chosen = [dataclasses.replace(m, tests=(*m.tests, *TIER_MARKERS[args.tier]))
              for m in MUTATIONS if not words or any(w in m.name for w in words)]
    if not chosen:
        print(f"error: --only {args.only!r} matches no mutation", file=sys.stderr)
        return 2
    problems = check_snippets(chosen)
    if problems:
        print("\n".join(f"error: {p}" for p in problems), file=sys.stderr)
        return 2
    if args.list:
        for m in chosen:
            print(f"{m.area:>12}  {m.name:<32} {m.why}\n{'':>14}tests: {' '.join(m.tests)}")
        return 0
    with tempfile.TemporaryDirectory(prefix="mutation-") as tmp:
        copy = pathlib.Path(tmp) / "repo"
        shutil.copytree(REPO, copy, ignore=shutil.ignore_patterns(*IGNORED))
        where = imported_from(copy)
        if not where.startswith(str(copy)):
            print(f"error: the copy imports scale_ablation from {where}", file=sys.stderr)
            return 2
        failing = [] if args.no_baseline else failing_baselines(copy, chosen, args.timeout)
        if failing:
            print("\n".join(f"error: fails unmutated: {f}" for f in failing), file=sys.stderr)
            return 2
        results = []
        for index, m in enumerate(chosen, 1):
            outcome, seconds = run_tests(copy, m, args.timeout)
            print(f"[{index}/{len(chosen)}] {outcome:<16} {seconds:6.1f} s  {m.name}", flush=True)
            results.append((m, outcome, seconds))
    return report(results)


def report(results: list[tuple[Mutation, str, float]]) -> int:
    print(f"\n{'outcome':<18} {'seconds':>8}  {'area':<12} mutation")
    for m, outcome, seconds in results:
        print(f"{outcome:<18} {seconds:8.1f}  {m.area:<12} {m.name}: {m.why}")
    survived = [m.name for m, outcome, _ in results if outcome.startswith("survived")]
    total = sum(seconds for *_, seconds in results)
    print(f"\n{len(results) - len(survived)}/{len(results)} killed in {total:.0f} s"
          + (f"; survived: {', '.join(survived)}" if survived else ""))
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
