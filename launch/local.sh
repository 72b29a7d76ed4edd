#!/usr/bin/env bash
# Run an experiment's sweep on this machine, then its report.
#
#   launch/local.sh                                   # experiments/dk_sweep.py:quick -> runs/dk_sweep_quick
#   launch/local.sh experiments/dk_sweep.py runs/dk --parallel=2
#   launch/local.sh --dry_run                         # print the commands, run nothing
#   launch/local.sh experiments/dk_sweep.py:quick runs/dk_mine --imports=my_policy.py --add_policies=my_policy
#
# Sets up the virtual environment first ($VENV, default .venv in the repo root; extras from
# $EXTRAS, e.g. EXTRAS=cuda12). Paths are relative to the repo root. --imports=... goes to both
# the sweep and the report, so that each imports the same user policies.
set -euo pipefail

usage="usage: launch/local.sh [EXPERIMENT.py[:VARIANT]] [WORKDIR] [--dry_run] [SWEEP_FLAG=VALUE ...] [-- SWEEP_ARGS ...]"
die() { echo "local.sh: $*" >&2; exit 2; }

# Print a command the way a user would type it, then run it unless this is a dry run.
quote() { if [[ $1 =~ ^[A-Za-z0-9_./:=,+@%-]+$ ]]; then printf '%s' "$1"; else printf "'%s'" "${1//\'/\'\\\'\'}"; fi; }
show() { local line="+" arg; for arg in "$@"; do line+=" $(quote "$arg")"; done; echo "$line"; }
run() { show "$@"; [[ -n $dry_run ]] || "$@"; }

dry_run="" positional=() sweep_args=() report_args=()
while (($#)); do
  case $1 in
    -h | --help) echo "$usage"; exit 0 ;;
    --dry_run) dry_run=1 ;;
    --) shift; sweep_args+=("$@"); break ;;  # verbatim, e.g. the sweep's own --dry_run
    --imports=*) sweep_args+=("$1"); report_args+=("$1") ;;
    -*) sweep_args+=("$1") ;;
    *) positional+=("$1") ;;
  esac
  shift
done
((${#positional[@]} <= 2)) || die "unexpected argument '${positional[2]}' (give sweep flags as --flag=value)"

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
spec=${positional[0]:-experiments/dk_sweep.py:quick}
file=${spec%%:*}
[[ -f $file ]] || die "experiment file not found: $file"
name=$(basename "$file" .py)
[[ $spec == *:* ]] && name+="_${spec#*:}"
workdir=${positional[1]:-runs/$name}

venv=${VENV:-.venv}
python=$venv/bin/python
stamp=$venv/.scale_ablation-installed
abs_python=$python
[[ $venv == /* ]] || abs_python=$repo/$python
# Install when the package is missing from the venv (checked from / so that the checkout itself
# doesn't count) or pyproject.toml changed since the last install by this script.
installed() {
  [[ -x $abs_python ]] || return 1
  (cd / && "$abs_python" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("scale_ablation") is None)') || return 1
  [[ ! -e $stamp || ! pyproject.toml -nt $stamp ]]
}
if ! installed; then
  [[ -x $abs_python ]] || run python3 -m venv "$venv"
  run "$python" -m pip install -e ".${EXTRAS:+[$EXTRAS]}"
  [[ -n $dry_run ]] || touch "$stamp"
fi

# The report runs only after a sweep that exited 0. Any other exit is the sweep's answer,
# repeated here with its status: 2 refused (bad input, a directory in use), 3 stopped (Ctrl-C,
# preempted: rerun to continue), 4 some run failed or is missing; a report now would judge runs
# that never finished.
status=0
run "$python" -m scale_ablation.sweep --config="$spec" --workdir="$workdir" --noreport ${sweep_args[@]+"${sweep_args[@]}"} || status=$?
((status == 2)) && exit 2  # refused, having run nothing: its one line is the whole answer
if ((status != 0)); then
  case $status in
    3) why="stopped or preempted: rerun the same command to continue" ;;
    4) why="some run failed or is missing, listed above" ;;
    *) why="failed" ;;
  esac
  echo "local.sh: the sweep exited $status ($why); no report (python -m scale_ablation.report $workdir reports the runs that finished)" >&2
  exit "$status"
fi
run "$python" -m scale_ablation.report ${report_args[@]+"${report_args[@]}"} "$workdir"
