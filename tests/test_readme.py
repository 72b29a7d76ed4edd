"""The README's "Adding a scale policy" and "Add your policy and sweep it" sections, followed to
the letter."""

import csv
import json
import pathlib
import re
import shlex
import subprocess
import sys
import tomllib

import jax
import numpy as np
import pytest

from experiments import dk_sweep
from scale_ablation.model import attention, policies
from scale_ablation.records import study_store
from scale_ablation.training import experiment_files as experiment

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


# --------------------------------------------------------------------------- Add your policy and sweep it

SWEEP_SECTION = "### Add your policy and sweep it"

# The d_k sweep's shape (policy × d_k × seed) at a size a test can afford: it stands in for
# experiments/dk_sweep.py:quick when the README's sweep command really runs.
TINY_DK_SWEEP = '''
from experiments import base


def get_config(arg=None):
    config = base.get_config("quick")
    config.model.d_model, config.model.num_layers, config.model.num_heads = 32, 1, 2
    config.data.seq_len, config.data.val_batches = 32, 1
    config.train.steps, config.train.batch_size, config.train.warmup_steps = 4, 4, 0
    config.train.log_every = config.train.eval_every = 2
    config.train.diag_every = 0
    config.checkpoint.every = 4
    config.wandb.mode = "offline"
    return config


def sweep(arg=None):
    return [{"policy": p, "model.head_dim": 16, "train.seed": 0} for p in ("inv_sqrt_dk", "none")]
'''


def readme_sweep_commands() -> list[list[str]]:
    """The section's bash block as argument lists (continuations joined, comments dropped)."""
    section = README.read_text().split(SWEEP_SECTION, 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.DOTALL).group(1).replace("\\\n", " ")
    return [shlex.split(line) for line in block.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


@pytest.mark.slow  # a sweep and its report in subprocesses, ~40 s; the example policy: above
def test_the_readme_takes_a_new_policy_file_to_a_sweep_report(tmp_path):
    policy_file = tmp_path / "my_policy.py"
    policy_file.write_text(readme_policy_example())  # "Save the example above as my_policy.py"

    def here(command: list[str]) -> list[str]:
        # The user's file and run directories under tmp_path; `python` is this interpreter.
        return [sys.executable if arg == "python" else
                arg.replace("my_policy.py", str(policy_file)).replace("runs/", f"{tmp_path}/runs/")
                for arg in command]

    def run(command: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run(here(command), cwd=README.parent, capture_output=True, text=True,
                              timeout=600)

    conformance, plan, sweep, report = readme_sweep_commands()
    result = run(conformance)
    assert result.returncode == 0, result.stdout + result.stderr
    assert int(re.search(r"(\d+) passed", result.stdout).group(1)) > 0
    assert "inv_dk_pow" in " ".join(conformance)

    result = run(plan)
    assert result.returncode == 0, result.stderr
    runs = dk_sweep.sweep("quick")
    added = [experiment.run_name({"policy": "inv_dk_pow:0.75", "model.num_heads": h,
                                   "model.head_dim": d, "model.init": init, "train.lr": lr,
                                   "train.seed": 0})
             for init in dk_sweep.INITS for h, d in dk_sweep.cells("quick")
             for lr in dk_sweep.QUICK_LRS]
    names = re.findall(r"^\s+pending\s+(\S+)$", result.stdout, re.MULTILINE)
    assert names[-len(added):] == added and len(names) == len(runs) + len(added)
    assert result.stdout.count(f"--imports={policy_file}") == len(names)
    assert not (tmp_path / "runs").exists()  # a plan writes nothing
    # The counts the text gives: "all 72 runs train" in a fresh directory, "only your 8" after
    # the quick sweep.
    text = README.read_text().split(SWEEP_SECTION, 1)[1]
    assert int(re.search(r"all (\d+) runs train", text).group(1)) == len(runs) + len(added)
    assert int(re.search(r"only your (\d+) train", text).group(1)) == len(added)

    # The sweep itself, on a grid of the same shape small enough for a test: first the quick
    # sweep alone ("where the quick sweep already ran"), then the README's command, which must
    # leave the finished runs as they are and train only the added policy's.
    tiny = tmp_path / "tiny_dk_sweep.py"
    tiny.write_text(TINY_DK_SWEEP)
    spec = "--config=experiments/dk_sweep.py:quick"
    assert spec in sweep
    sweep = [f"--config={tiny}" if arg == spec else arg for arg in sweep]
    result = run([arg for arg in sweep if not arg.startswith(("--imports=", "--add_policies="))])
    assert result.returncode == 0, result.stdout + result.stderr
    sweep_dir = tmp_path / "runs" / "dk_sweep_quick"
    finished = {path: (path.stat().st_mtime_ns, path.read_bytes())
                for path in sweep_dir.glob("*/summary.json")}
    assert len(finished) == 2
    result = run(sweep)
    assert result.returncode == 0, result.stdout + result.stderr
    assert {path: (path.stat().st_mtime_ns, path.read_bytes()) for path in finished} == finished
    assert len(list(sweep_dir.glob("*/summary.json"))) == 3
    result = run(report)
    assert result.returncode == 0, result.stderr
    with open(sweep_dir / "report" / "summary.csv") as f:
        rows = {row["policy"]: row for row in csv.DictReader(f)}
    assert list(rows) == ["inv_sqrt_dk", "none", "inv_dk_pow:0.75"]
    mine = json.loads((sweep_dir / rows["inv_dk_pow:0.75"]["name"] / "summary.json").read_text())
    assert mine["status"] == rows["inv_dk_pow:0.75"]["status"] == "completed"
    assert float(rows["inv_dk_pow:0.75"]["final_val_bpb"]) == mine["final_val_bpb"]


def test_the_readme_entry_point_group_is_the_one_policies_reads():
    section = README.read_text().split(SWEEP_SECTION, 1)[1]
    toml = tomllib.loads(re.search(r"```toml\n(.*?)```", section, re.DOTALL).group(1))
    assert list(toml["project"]["entry-points"]) == [policies.ENTRY_POINT_GROUP]


RESULT_READMES = sorted((README.parent / "experiments" / "results").glob("*/README.md"))
# A sweep's write-up quotes its claims.md; a probe's (entropy_table: no training) has none.
STUDY_READMES = [p for p in RESULT_READMES if (p.parent / "claims.md").exists()]


@pytest.mark.parametrize("doc", [README, *RESULT_READMES],
                         ids=lambda p: str(p.relative_to(README.parent)))
def test_verdicts_quoted_anywhere_are_the_committed_claims_files(doc):
    """No verdict in a README is typed by hand: each quoted block is a report's claims.md."""
    blocks = re.findall(r"<!-- claims: (\S+) -->\n(.*?)<!-- end claims -->", doc.read_text(),
                        re.DOTALL)
    for path, quoted in blocks:
        lines = [line.removeprefix(">").removeprefix(" ") for line in quoted.splitlines()]
        committed = (README.parent / path).read_text().strip().splitlines()
        assert lines == committed, path
    verdicts = re.findall(r"Verdict[^\n]*?: \*\*(\w+(?: \w+)?)\*\*", doc.read_text())
    quoted_verdicts = [v for _, q in blocks for v in re.findall(r"Verdict[^\n]*?: \*\*(\w+(?: \w+)?)\*\*", q)]
    assert verdicts == quoted_verdicts  # none outside the quoted files


def test_every_published_study_has_a_write_up_quoting_its_claims():
    studies = sorted(p.parent for p in (README.parent / "experiments" / "results").glob("*/claims.md"))
    assert studies and [p.parent for p in STUDY_READMES] == studies
    for doc in STUDY_READMES:
        assert f"<!-- claims: experiments/results/{doc.parent.name}/claims.md -->" in doc.read_text()


def test_the_results_index_links_every_study_with_its_runs_counted():
    """Every study is in the index (generated from the claims table: tests/test_claims_table.py),
    its runs cell the count its store holds."""
    index = README.read_text().split("## Results", 1)[1].split("\n## ", 1)[0]
    for doc in STUDY_READMES:
        link = f"[{doc.parent.name}](experiments/results/{doc.parent.name}/README.md)"
        row = next(line for line in index.splitlines() if f"| {link} |" in line)
        if (store := study_store.store_path(str(doc.parent))) is not None:  # runs, counted
            assert row.split(" | ")[1] == str(study_store.run_count(store))


POLICIES_DOC = README.parent / "docs" / "policies.md"

# Run in a fresh interpreter that imports the registry alone: what a user's own script sees (the
# registry loads its built-ins on the first lookup), without the policies this test session
# registers (the README's example above, the conformance suite's test policies).
REGISTERED_POLICIES = """
import json
from scale_ablation.model import policies
fused = {}
for name in policies.available():
    try:
        fused[name] = "yes" if policies.get(name).fused_unsupported() is None else "no"
    except ValueError:  # its argument has no default (`const:c`): no bare instance to ask
        fused[name] = None
print(json.dumps(fused))
"""


def documented_policies(doc: str) -> dict[str, str]:
    """{policy name: its "fused" cell} for every name in the first column of the doc's table,
    composition rows (`A+B`) left out."""
    rows = [line.strip().strip("|").split("|") for line in doc.splitlines()
            if line.startswith("| `")]
    return {name: cells[-1].strip() for cells in rows if "+" not in cells[0]
            for name in re.findall(r"`([A-Za-z_]\w*)", cells[0])}


def test_the_policy_table_lists_every_registered_policy_and_only_those():
    result = subprocess.run([sys.executable, "-c", REGISTERED_POLICIES], cwd=README.parent,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    registered = json.loads(result.stdout)
    documented = documented_policies(POLICIES_DOC.read_text())
    assert sorted(set(registered) - set(documented)) == []  # missing from the table
    assert sorted(set(documented) - set(registered)) == []  # a row for no policy
    for name, fused in registered.items():
        if fused is not None:
            assert documented[name] == fused, name
    assert "(docs/policies.md)" in README.read_text()


def test_the_readme_is_a_reference_not_a_results_dump():
    assert README.read_text().count("\n") < 350
