#!/usr/bin/env bash
# Run the published CPU studies to their reports, one after another, on a machine that may keep
# nothing between sessions:
#
#   bash launch/cpu_studies.sh --list                # the studies, their commands, in order
#   bash launch/cpu_studies.sh --plan [STUDY ...]     # what is left of each: runs, FLOPs, hours
#                                                    # (at a matmul rate measured now: run it idle)
#   bash launch/cpu_studies.sh [--commit] [STUDY ...] # default: every study, in the order listed
#   bash launch/cpu_studies.sh --retrain [--commit] STUDY ...
#                                                    # train STUDY anew (in runs/STUDY.retrain,
#                                                    # not seeded from its published runs:
#                                                    # what a change to what runs record needs);
#                                                    # publishing then replaces those runs
#
# For each STUDY: runs/STUDY is seeded from experiments/pending/STUDY/runs.parquet (a stash left
# by an earlier, interrupted session) and from its published runs (experiments/results/STUDY/
# runs.parquet, written back as run directories: `records.study_store extract`), the study's
# sweep runs in the background, and each time more runs finish their records are stashed again
# (`publish --record_only`; with --commit, the stash alone is committed). When the sweep ends
# it is published into experiments/results/STUDY (report, runs.parquet, the READMEs' quotes), the
# monitoring bands are recomputed (experiments/results/monitoring_bands.md) and the stash goes. A study published for
# the first time is left uncommitted, its stash kept, and the programme stops there: its
# write-up is a person's to write.
# Only what is not yet finished trains, so rerunning this after an interruption resumes.
set -euo pipefail
cd "$(dirname "$0")/.."

# study: config and the sweep's flags (its README's command). Order: the issue's importance.
declare -A COMMAND=(
  [dk_exponent_cpu]="--config=experiments/dk_exponent.py:cpu"
  [dk_sweep_cpu]="--config=experiments/dk_sweep.py:cpu --refine"
  # One round: a ×2 grid brackets each best at ×1.41 after it (issue 54's §1 list).
  [explode_or_oscillate_cpu]="--config=experiments/explode_or_oscillate.py:cpu --refine --refine_rounds=1"
  # No --refine: its claims count divergences at fixed LRs (as precision_cpu's).
  [precision_dk_cpu]="--config=experiments/precision_dk.py:cpu"
  # One round, as stability_cpu, whose grid it carries to the large end.
  [stability_dropout_cpu]="--config=experiments/stability_dropout.py:cpu --refine --refine_rounds=1"
  [mqar_cpu]="--config=experiments/mqar.py:cpu --refine --refine_rounds=1"
  [lr_sensitivity_cpu]="--config=experiments/lr_sensitivity.py:cpu --refine"
  [learned_scale_cpu]="--config=experiments/learned_scale.py:cpu --refine"
  # No --refine: precision's claims compare its arms at fixed LRs (divergence counts at the two
  # large ones); LRs a refinement would add enter none of them.
  [precision_cpu]="--config=experiments/precision.py:cpu"
  # One round for the last four (as mqar): their ×3.16 grids bracket each best at ×1.78 after
  # it, close enough for the parabola that locates it, at two thirds of two rounds' runs.
  [stability_cpu]="--config=experiments/stability.py:cpu --refine --refine_rounds=1"
  [init_gain_cpu]="--config=experiments/init_gain.py:cpu --refine --refine_rounds=1"
  [norm_placement_cpu]="--config=experiments/norm_placement.py:cpu --refine --refine_rounds=1"
  [length_generalization_cpu]="--config=experiments/length_generalization.py:cpu --refine --refine_rounds=1"
  # Issue 53 item 6: seeds 2-4 of the three claimed settings, at every LR refining added.
  [mup_transfer_cpu]="--config=experiments/mup_transfer.py:cpu --refine"
  # Issue 53 item 4: the 200-step half is published (`:cpu_short`, two rounds of --refine: the
  # shared ×2 LR grid left nearly every best on an edge); `:cpu` adds the 1,600-step runs, whose
  # LR grids are centred per C on those bests. Round 3 is the first the long runs can use (the
  # rounds are counted over the study). At most 18 runs an ensemble: one finishes (~45 min)
  # within a session, where a 54-run one would take ~2 h.
  [dk_exponent_regime_cpu]="--config=experiments/dk_exponent_regime.py:cpu --refine --refine_rounds=3 --max_members=18"
  # Issue 55: the head-dim, depth and u-μP transfer studies.
  [mup_head_dim_cpu]="--config=experiments/mup_head_dim.py:cpu --refine"
  [completep_transfer_cpu]="--config=experiments/completep_transfer.py:cpu --refine"
  [umup_transfer_cpu]="--config=experiments/umup_transfer.py:cpu --refine"
)
ORDER=(mup_transfer_cpu dk_exponent_regime_cpu mup_head_dim_cpu completep_transfer_cpu umup_transfer_cpu
       dk_exponent_cpu dk_sweep_cpu explode_or_oscillate_cpu precision_dk_cpu stability_dropout_cpu mqar_cpu
       lr_sensitivity_cpu learned_scale_cpu precision_cpu stability_cpu init_gain_cpu norm_placement_cpu
       length_generalization_cpu)
POLL_SECONDS=${POLL_SECONDS:-60}

die() { echo "cpu_studies.sh: $*" >&2; exit 2; }
# Finished runs (completed or diverged: what a stash keeps, `publish.finished_runs`) under $1.
# summary.json is written with one key a line (`records.jsonfiles`); grep finding none is no error.
count_finished() {
  { compgen -G "$1/*/summary.json" | xargs -r -d '\n' grep -lE '^  "status": "(completed|diverged)"' \
      || true; } | wc -l
}
# Where STUDY trains: runs/STUDY, or runs/STUDY.retrain under --retrain (kept apart, so that
# an interrupted retrain resumes from its own runs and never from the published ones).
workdir() { if ((retrain)); then echo "runs/$1.retrain"; else echo "runs/$1"; fi; }
finished() { count_finished "$(workdir "$1")"; }
# Write the runs of the study store in folder $1 into sweep directory $2 as run directories.
extract() { "$python" -m scale_ablation.records.study_store extract "$1" "$2" >/dev/null; }

commit=0 plan=0 retrain=0 studies=()
for arg in "$@"; do
  case $arg in
    --list) for s in "${ORDER[@]}"; do
              echo "$s: python -m scale_ablation.sweep ${COMMAND[$s]} --workdir=runs/$s"; done
            exit 0 ;;
    --commit) commit=1 ;;
    --plan) plan=1 ;;
    --retrain) retrain=1 ;;
    -*) die "unknown flag $arg (flags: --list, --plan, --commit, --retrain)" ;;
    *) [[ -v COMMAND[$arg] ]] || die "unknown study $arg (--list names them)"; studies+=("$arg") ;;
  esac
done
((${#studies[@]} || !retrain)) || die "--retrain needs the studies to train anew, by name"
((${#studies[@]})) || studies=("${ORDER[@]}")
python=${VENV:-.venv}/bin/python
[[ -x $python ]] || die "no $python: make the venv first (the README's install line) or set VENV"

if ((plan)); then  # the sweep's own planner, on what runs/STUDY (or its stash) still lacks
  for study in "${studies[@]}"; do
    workdir=$(workdir "$study")
    if [[ ! -d $workdir && -f experiments/pending/$study/runs.parquet ]]; then  # the stash's runs
      workdir=$(mktemp -d)
      "$python" -m scale_ablation.records.study_store extract "experiments/pending/$study" "$workdir" >/dev/null
    fi
    # shellcheck disable=SC2086  # the flags are words
    "$python" -m scale_ablation.sweep ${COMMAND[$study]} "--workdir=$workdir" --plan \
      | grep -E "^(plan|total|rate):" | sed "s|^|$study: |"
  done
  exit 0
fi

# Stash (and with --commit, commit) the finished runs of STUDY if more have landed than $stashed.
stash() {
  local study=$1 pending=experiments/pending/$1 now
  now=$(finished "$study")
  ((now > stashed)) || return 0
  # A failed stash or commit (another git command holding the index) is retried at the next
  # poll; it must not end this script while the sweep trains on.
  mkdir -p experiments/pending
  "$python" -m scale_ablation.publish --record_only "$(workdir "$study")" "$pending" || return 0
  if ((commit)); then
    git add "$pending/runs.parquet" && git commit -q -m "$study: $now finished runs stashed, the sweep \
still running" -- "$pending" || { echo "cpu_studies.sh: commit failed; retried" >&2; return 0; }
  fi
  stashed=$now
}

run_study() {
  local study=$1 pending=experiments/pending/$1 pid dir
  dir=$(workdir "$study")
  mkdir -p "$dir"
  # A run already in $dir is left as it is (extract skips it).
  [[ -f $pending/runs.parquet ]] && extract "$pending" "$dir"
  # A published study whose design grew (precision_cpu) trains only the runs it lacks.
  local published=experiments/results/$study
  [[ -f $published/runs.parquet ]] && ((!retrain)) && extract "$published" "$dir"
  # What the stash holds, not what runs/ holds: runs finished before an interruption are
  # stashed at the first poll.
  stashed=$("$python" -m scale_ablation.records.study_store count "$pending")
  # shellcheck disable=SC2086  # the flags are words
  "$python" -m scale_ablation.sweep ${COMMAND[$study]} "--workdir=$dir" &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do sleep "$POLL_SECONDS"; stash "$study"; done
  local code=0
  wait "$pid" || code=$?
  stash "$study"
  ((code == 0)) || die "$study: the sweep exited $code; its finished runs are stashed in $pending"
  "$python" -m scale_ablation.publish "$dir" "experiments/results/$study"
  "$python" -m scale_ablation.analysis.monitoring_bands  # the bands vs every study's best runs
  if [[ ! -f experiments/results/$study/README.md ]]; then  # a study published the first time
    # Stop here: the next study's commit would carry bands computed with this one's rows.
    echo "cpu_studies.sh: $study is published but not committed: write its README and its" \
      "results-index row (tests/test_readme.py), commit it with the bands, remove $pending," \
      "then rerun this for the studies after it" >&2
    exit 0
  fi
  local paths=("experiments/results/$study" experiments/results/monitoring_bands.md README.md)
  if ((commit)) && git ls-files --error-unmatch "$pending" >/dev/null 2>&1; then
    git rm -rq "$pending" && paths+=("$pending")
  fi
  rm -rf "$pending"
  if ((commit)); then
    git add "experiments/results/$study"
    git commit -q -m "$study: published from its $(finished "$study") run files" -- "${paths[@]}"
  fi
}

# One line, read whole before it runs: editing this file (or pulling a new one) while a
# programme runs cannot change what the running one does next.
for study in "${studies[@]}"; do run_study "$study"; done; exit 0
