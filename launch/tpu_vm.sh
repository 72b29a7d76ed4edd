#!/usr/bin/env bash
# One run on a Cloud TPU VM or pod slice: create it, copy this checkout to every worker, install,
# run on all workers at once, copy the run directory back from worker 0, optionally delete it.
#
#   launch/tpu_vm.sh --zone=us-central2-b --type=v4-8 --config=experiments/base.py:gpu --workdir=runs/tpu
#   launch/tpu_vm.sh --zone=us-west4-a --type=v5litepod-16 --config=... --delete -- --config.train.steps=2000
#   launch/tpu_vm.sh --dry_run --zone=...             # print the gcloud commands, run nothing
#
# Flags override the environment: TPU_NAME, TPU_ZONE, TPU_TYPE, TPU_VERSION. Arguments after
# `--` (and any --config.FIELD=VALUE or --imports=...) go to scale_ablation.main; files named by
# --imports must lie inside this checkout, which is what the VM gets. On a multi-host slice every
# worker runs main and jax.distributed.initialize() finds its peers from the TPU metadata.
# Checkpoints of a multi-host run need a directory every worker sees (e.g. a gs:// --workdir, if
# main is given one); a local --workdir is copied back from worker 0 only.
set -euo pipefail

usage="usage: launch/tpu_vm.sh --zone=ZONE [--name=NAME] [--type=TYPE] [--version=RUNTIME] [--config=EXPERIMENT.py[:VARIANT]] [--workdir=DIR] [--delete] [--dry_run] [-- MAIN_FLAGS ...]"
die() { echo "tpu_vm.sh: $*" >&2; exit 2; }

quote() { if [[ $1 =~ ^[A-Za-z0-9_./:=,+@%-]+$ ]]; then printf '%s' "$1"; else printf "'%s'" "${1//\'/\'\\\'\'}"; fi; }
show() { local line="+" arg; for arg in "$@"; do line+=" $(quote "$arg")"; done; echo "$line"; }
run() { show "$@"; [[ -n $dry_run ]] || "$@"; }

name=${TPU_NAME:-scale-ablation} zone=${TPU_ZONE:-} type=${TPU_TYPE:-v4-8} version=${TPU_VERSION:-}
spec=experiments/base.py workdir="" delete="" dry_run="" main_args=()
while (($#)); do
  case $1 in
    -h | --help) echo "$usage"; exit 0 ;;
    --name=*) name=${1#*=} ;;
    --zone=*) zone=${1#*=} ;;
    --type=*) type=${1#*=} ;;
    --version=*) version=${1#*=} ;;
    --config=*) spec=${1#*=} ;;
    --workdir=*) workdir=${1#*=} ;;
    --delete) delete=1 ;;
    --dry_run) dry_run=1 ;;
    --config.* | --imports=*) main_args+=("$1") ;;
    --) shift; main_args+=("$@"); break ;;
    *) die "unknown argument '$1' (see --help; flags take --flag=value)" ;;
  esac
  shift
done
[[ -n $zone ]] || die "--zone=ZONE (or TPU_ZONE) is required, e.g. us-central2-b for v4"
[[ $name =~ ^[a-z]([-a-z0-9]*[a-z0-9])?$ ]] || die "--name=$name: use lowercase letters, digits and hyphens"
[[ $type =~ ^v[0-9]+[a-z]*-[0-9]+$ ]] || die "--type=$type: expected e.g. v4-8, v5litepod-16, v5p-8, v6e-8"
# The runtime (OS image) that Google lists for JAX on each generation.
if [[ -z $version ]]; then
  case $type in
    v6e-*) version=v2-alpha-tpuv6e ;;
    v5p-*) version=v2-alpha-tpuv5 ;;
    v5litepod-* | v5e-*) version=v2-alpha-tpuv5-lite ;;
    *) version="tpu-ubuntu2204-base" ;;
  esac
fi
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[[ -f ${spec%%:*} ]] || die "experiment file not found: ${spec%%:*}"
# A policy file given to --imports travels with the checkout: it must be a file inside it.
for arg in ${main_args[@]+"${main_args[@]}"}; do
  [[ $arg == --imports=* ]] || continue
  IFS=, read -ra entries <<< "${arg#--imports=}"
  for entry in ${entries[@]+"${entries[@]}"}; do
    [[ $entry == *.py || $entry == */* ]] || continue  # a module name: installed or in the checkout
    [[ -f $entry ]] || die "--imports: file not found: $entry"
    [[ $(cd "$(dirname "$entry")" && pwd)/ == "$PWD"/* ]] || die "--imports: $entry is outside the checkout, which is all the TPU VM gets; move it inside"
    [[ $entry != /* ]] || die "--imports: give $entry relative to the repo root (the VM's copy of the checkout is elsewhere)"
  done
done
if [[ -z $workdir ]]; then
  workdir=runs/$(basename "${spec%%:*}" .py)
  [[ $spec == *:* ]] && workdir+="_${spec#*:}"
fi
remote_workdir=$workdir
[[ $workdir == /* ]] || remote_workdir=scale_ablation/$workdir

tpu=(gcloud compute tpus tpu-vm)
where=(--zone="$zone")
remote_cmd() { local line="" arg; for arg in "$@"; do line+="${line:+ }$(quote "$arg")"; done; echo "$line"; }

# With --delete the VM goes whatever happens, so a failed step leaves nothing billed behind.
deleted=""
# shellcheck disable=SC2317  # called by the trap
cleanup() { if [[ -n $delete && -z $deleted ]]; then deleted=1; run "${tpu[@]}" delete "$name" "${where[@]}" --quiet; fi; }
trap cleanup EXIT

# Re-running the script reuses an existing VM of that name.
if [[ -n $dry_run ]] || ! "${tpu[@]}" describe "$name" "${where[@]}" >/dev/null 2>&1; then
  run "${tpu[@]}" create "$name" "${where[@]}" --accelerator-type="$type" --version="$version"
fi

# The working tree as it is (tracked and untracked files, not ignored ones such as .venv/ runs/).
tarball=${TMPDIR:-/tmp}/scale_ablation-$name.tar.gz
show bash -c "git ls-files -z --cached --others --exclude-standard | tar -czf $(quote "$tarball") --null -T -"
[[ -n $dry_run ]] || git ls-files -z --cached --others --exclude-standard | tar -czf "$tarball" --null -T -
run "${tpu[@]}" scp "$tarball" "$name":scale_ablation.tar.gz "${where[@]}" --worker=all
# The TPU images ship Ubuntu 22.04's Python 3.10 and jax>=0.7 needs 3.11+: uv fetches a newer one.
# The [hf] extra: the gpu variants stream their corpus (scale_ablation/data/huggingface.py).
run "${tpu[@]}" ssh "$name" "${where[@]}" --worker=all --command="mkdir -p scale_ablation && tar -xzf scale_ablation.tar.gz -C scale_ablation && cd scale_ablation \
&& { test -x .venv/bin/python || { python3 -m pip install --user -q uv && ~/.local/bin/uv venv --seed --python 3.12 .venv; }; } \
&& .venv/bin/pip install -q -e \".[tpu,hf]\""

# Copy back whatever the run left, even when it failed; exit with the run's status.
status=0
run "${tpu[@]}" ssh "$name" "${where[@]}" --worker=all --command="cd scale_ablation && $(remote_cmd .venv/bin/python -m scale_ablation.main --config="$spec" --workdir="$workdir" ${main_args[@]+"${main_args[@]}"})" || status=$?
run mkdir -p "$(dirname "$workdir")"
run "${tpu[@]}" scp --recurse "$name:$remote_workdir" "$(dirname "$workdir")" "${where[@]}" --worker=0 || { rc=$?; ((status)) || status=$rc; }
exit "$status"
