#!/usr/bin/env bash
# A one-node Slurm cluster on this machine (munge, slurmctld, slurmd), to run launch/slurm.sbatch
# for real without a cluster: the tests marked `slurm` use it, and so can a user.
#
#   sudo launch/slurm_local_cluster.sh start    # install if needed (apt-get), configure, start
#   launch/slurm_local_cluster.sh status        # exit 0 when the node accepts jobs
#   sudo launch/slurm_local_cluster.sh stop     # stop the daemons (configuration and packages stay)
#
# `start` is idempotent: it installs Debian's slurm-wlm and munge only when missing, writes
# /etc/slurm/slurm.conf (this host with all its CPUs, one partition `cpu`) only when it differs,
# and starts only the daemons that are not running. No systemd is needed: the daemons run
# directly. Submit with the script's GPU defaults overridden, e.g.
#   sbatch --partition=cpu --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 --gpus-per-task=0 \
#     launch/slurm.sbatch --config=experiments/base.py:quick --workdir=runs/slurm_quick
set -euo pipefail

usage="usage: launch/slurm_local_cluster.sh start|stop|status"
die() { echo "slurm_local_cluster.sh: $*" >&2; exit 2; }
conf=/etc/slurm/slurm.conf
state=/var/lib/slurm
logs=/var/log/slurm

need_root() { ((EUID == 0)) || die "$1 needs root (it installs packages and starts system daemons)"; }

install() {
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
    && command -v sbatch >/dev/null && return
  command -v apt-get >/dev/null || die "slurm-wlm and munge are missing and there is no apt-get to install them"
  echo "installing slurm-wlm and munge"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null
}

write_config() {
  local host node
  host=$(hostname -s)
  # slurmd's own view of the hardware (sockets, cores, threads, memory): exactly what it will
  # check the node against when it registers.
  node=$(slurmd -C | head -n 1)
  [[ $node == "NodeName=$host "* ]] || die "unexpected 'slurmd -C' output: $node"
  mkdir -p "$(dirname "$conf")" "$state/slurmctld" "$state/slurmd" "$logs"
  local new
  new=$(cat <<EOF
# Written by launch/slurm_local_cluster.sh: a one-node cluster on $host.
ClusterName=local
SlurmctldHost=$host
AuthType=auth/munge
# A requeued job waits out the credential lifetime before it starts again (default 120 s).
AuthInfo=cred_expire=30
SlurmUser=root
StateSaveLocation=$state/slurmctld
SlurmdSpoolDir=$state/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$logs/slurmctld.log
SlurmdLogFile=$logs/slurmd.log
# No cgroups or systemd here (containers): track and bind processes the plain way.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
# The node comes back at once after a restart of slurmd, and jobs start without delay.
SlurmdTimeout=30
KillWait=30
$node State=UNKNOWN
PartitionName=cpu Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
)
  if [[ ! -f $conf ]] || [[ $(cat "$conf") != "$new" ]]; then
    echo "$new" >"$conf"
    echo "wrote $conf"
  fi
}

# Each daemon writes its pid file; the script checks and stops daemons by those pids only.
declare -A pidfile=([munged]=/run/munge/munged.pid [slurmctld]=/run/slurmctld.pid [slurmd]=/run/slurmd.pid)
pid_of() { [[ -s ${pidfile[$1]} ]] && cat "${pidfile[$1]}"; }
running() { local pid; pid=$(pid_of "$1") && kill -0 "$pid" 2>/dev/null; }
stop_daemon() {
  local pid _
  running "$1" || return 0
  pid=$(pid_of "$1")
  kill "$pid"
  for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.5; done
  die "$1 (pid $pid) did not stop within 30 s"
}

start_munge() {
  running munged && return
  [[ -f /etc/munge/munge.key ]] || mungekey --create --keyfile=/etc/munge/munge.key
  chown munge:munge /etc/munge/munge.key
  chmod 0400 /etc/munge/munge.key
  mkdir -p /run/munge
  chown munge:munge /run/munge
  runuser -u munge -- /usr/sbin/munged
}

wait_until_ready() {
  local _
  for _ in $(seq 1 60); do
    if sinfo -h -o '%t' 2>/dev/null | grep -qE '^(idle|mix|alloc)'; then return 0; fi
    sleep 1
  done
  die "the node did not become ready within 60 s; see $logs/slurmctld.log and $logs/slurmd.log"
}

start() {
  need_root start
  install
  write_config
  start_munge
  # A changed slurm.conf takes effect only on restart: restart both daemons then.
  if running slurmctld && [[ $conf -nt /run/slurmctld.pid ]]; then stop_daemons; fi
  running slurmctld || slurmctld
  running slurmd || slurmd
  wait_until_ready
  # A node left DOWN or DRAINED by an earlier unclean stop: put it back in service.
  scontrol update nodename="$(hostname -s)" state=resume 2>/dev/null || true
  echo "slurm is up: $(sinfo -h -o '%P %D node(s) %c CPUs %t')"
}

stop_daemons() { stop_daemon slurmd; stop_daemon slurmctld; }

stop() {
  need_root stop
  stop_daemons
  stop_daemon munged
  echo "slurm and munge stopped"
}

status() {
  local daemon ok=0
  for daemon in munged slurmctld slurmd; do
    if running "$daemon"; then echo "$daemon: running"; else echo "$daemon: stopped"; ok=1; fi
  done
  if ((ok == 0)); then sinfo -h -o '%P %D node(s) %c CPUs %t' || ok=1; fi
  return $ok
}

case ${1-} in
  start) start ;;
  stop) stop ;;
  status) status ;;
  -h | --help) echo "$usage" ;;
  *) die "$usage" ;;
esac
