#!/usr/bin/env bash
# A real single-machine Slurm for trying cluster/bench.sbatch (and for tests/grid/test_slurm.py): munged, slurmctld and
# one slurmd for this host, every file (key, socket, config, state, logs, pids) in one folder of its own, ports free
# at start. Needs root and Debian's slurm-wlm and munge packages (apt-get install -y slurm-wlm munge).
#
#   benchmarks/slurm_local.sh start DIR     # prints the SLURM_CONF to export for sbatch, squeue, scancel
#   benchmarks/slurm_local.sh stop DIR      # stops what start started (by the pids it wrote), nothing else
#
# It does not touch /etc/slurm or /etc/munge, nor any other Slurm or munge on the machine.
set -euo pipefail

usage() { echo "usage: $0 start|stop DIR" >&2; exit 2; }
[ $# -eq 2 ] || usage
action=$1
dir=$(realpath -m "$2")

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

stop_pidfile() {  # SIGTERM to the process a pid file names, SIGKILL after 30 s
    local file=$1 pid
    [ -s "$file" ] || return 0
    pid=$(cat "$file")
    kill -TERM "$pid" 2>/dev/null || { rm -f "$file"; return 0; }
    for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -KILL "$pid" 2>/dev/null || true
    rm -f "$file"
}

case $action in
start)
    [ "$(id -u)" -eq 0 ] || { echo "slurm_local.sh: needs root (slurmd runs jobs as their users)" >&2; exit 1; }
    for tool in munged mungekey slurmctld slurmd sbatch; do
        command -v "$tool" >/dev/null || { echo "slurm_local.sh: $tool not found: apt-get install -y slurm-wlm munge" >&2; exit 1; }
    done
    mkdir -p "$dir/state" "$dir/spool"
    [ -s "$dir/munge.key" ] || mungekey --create --keyfile "$dir/munge.key" --force
    chmod 0400 "$dir/munge.key"
    munged --force --socket "$dir/munge.sock" --key-file "$dir/munge.key" --pid-file "$dir/munged.pid" \
        --log-file "$dir/munged.log" --seed-file "$dir/munged.seed"
    host=$(hostname -s)
    cpus=$(getconf _NPROCESSORS_ONLN)  # not nproc: it answers $OMP_NUM_THREADS where that is set
    memory=$(awk '/MemTotal/ {print int($2 / 1024 / 2)}' /proc/meminfo)  # half the machine's memory, in MiB
    cat > "$dir/slurm.conf" <<CONF
ClusterName=benchlocal
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
AuthType=auth/munge
AuthInfo=socket=$dir/munge.sock
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
KillWait=30
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$memory State=UNKNOWN
PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
    export SLURM_CONF=$dir/slurm.conf
    slurmctld -i   # -i: ignore state a previous start left in $dir/state
    slurmd
    for _ in $(seq 120); do
        if sinfo -h -o %t 2>/dev/null | grep -qx idle; then
            echo "export SLURM_CONF=$dir/slurm.conf"
            exit 0
        fi
        sleep 0.5
    done
    echo "slurm_local.sh: the node did not become idle in 60 s; logs in $dir" >&2
    exit 1
    ;;
stop)
    stop_pidfile "$dir/slurmd.pid"
    stop_pidfile "$dir/slurmctld.pid"
    stop_pidfile "$dir/munged.pid"
    ;;
*) usage ;;
esac
