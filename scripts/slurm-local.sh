#!/usr/bin/env bash
# A real two-node SLURM cluster on loopback, for tests: scripts/slurm-local.sh up|down|status
#
# Everything (config, munge key and socket, state, spool, logs, pid files) lives in one
# private dir: $TORCHSTAGE_SLURM_DIR, default <repo>/.slurm-local. Clients find the cluster
# with `source <dir>/env` (exports SLURM_CONF). Needs root and Debian's slurm/munge packages
# (installed with apt-get when missing). Daemons are stopped only by the PIDs in their own
# pid files. See docs/slurm.md.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${TORCHSTAGE_SLURM_DIR:-$REPO/.slurm-local}"
CTLD_PORT="${TORCHSTAGE_SLURM_CTLD_PORT:-6817}"   # slurmctld port
NODE_PORT="${TORCHSTAGE_SLURM_NODE_PORT:-17001}"  # slurmd ports: NODE_PORT, NODE_PORT+1
WAIT_S="${TORCHSTAGE_SLURM_WAIT_S:-30}"           # bound on waiting for idle nodes
CRED_EXPIRE_S="${TORCHSTAGE_SLURM_CRED_EXPIRE_S:-5}"  # also the delay before a requeued job may start again (SLURM default 120)
NODES=(node1 node2)
CONF="$DIR/slurm.conf"
MUNGE_SOCKET="$DIR/munge/munge.socket"

say() { echo "slurm-local: $*"; }
die() { echo "slurm-local: error: $*" >&2; exit 1; }

# name|pidfile|binary for every daemon we run, in start order
daemons() {
    echo "munged|$DIR/run/munged.pid|/usr/sbin/munged"
    echo "slurmctld|$DIR/run/slurmctld.pid|/usr/sbin/slurmctld"
    for n in "${NODES[@]}"; do echo "slurmd-$n|$DIR/run/slurmd-$n.pid|/usr/sbin/slurmd"; done
}

# PID from a pid file if that process is alive and runs the expected binary (links resolved).
live_pid() {
    local pidfile=$1 binary=$2 pid exe
    [[ -s $pidfile ]] || return 1
    pid=$(tr -dc '0-9' <"$pidfile")
    [[ -n $pid && -e /proc/$pid ]] || return 1
    exe=$(readlink -f "/proc/$pid/exe" 2>/dev/null) || return 1
    [[ $exe == "$(readlink -f "$binary")" ]] || return 1
    echo "$pid"
}

# Running (a zombie counts as gone: PID 1 of a container may be slow to reap it).
running() { [[ -e /proc/$1 ]] && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null; }

all_alive() {
    local name pidfile binary
    while IFS='|' read -r name pidfile binary; do
        live_pid "$pidfile" "$binary" >/dev/null || return 1
    done < <(daemons)
}

# Every node in a state matching $1 (sinfo's short states: idle, alloc, mix, comp, down, ...).
nodes_in() {
    local states
    states=$(SLURM_CONF=$CONF timeout 10 sinfo -h -N -o '%N %t' 2>/dev/null | sort -u) || return 1
    [[ $(grep -cE " ($1)\$" <<<"$states") -eq ${#NODES[@]} ]]
}

ensure_packages() {
    local missing=0 b
    for b in /usr/sbin/slurmctld /usr/sbin/slurmd /usr/sbin/munged /usr/sbin/mungekey sinfo srun sbatch scontrol; do
        command -v "$b" >/dev/null || missing=1
    done
    [[ $missing == 0 ]] && return 0
    [[ $(id -u) == 0 ]] || die "slurm/munge packages missing and not root: cannot install them"
    command -v apt-get >/dev/null || die "slurm/munge packages missing and no apt-get (not Debian?)"
    say "installing slurmctld slurmd slurm-client munge"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        slurmctld slurmd slurm-client munge >/dev/null
}

# Node names resolve like a real cluster's DNS would: add them to /etc/hosts only if missing.
ensure_hosts() {
    local missing=() n
    for n in "${NODES[@]}"; do getent hosts "$n" >/dev/null || missing+=("$n"); done
    if ((${#missing[@]})); then
        echo "127.0.0.1 ${missing[*]}" >>/etc/hosts
        say "added '127.0.0.1 ${missing[*]}' to /etc/hosts"
    fi
}

write_config() {
    local mem
    mem=$(awk '/MemTotal/ {print int($2 / 1024)}' /proc/meminfo)
    mkdir -p "$DIR"/{munge,state,run,log} "${NODES[@]/#/$DIR/spool/}"
    chmod 0711 "$DIR/munge"  # munged refuses a socket folder that is not world-executable
    cat >"$CONF" <<EOF
# written by scripts/slurm-local.sh
ClusterName=torchstage
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET,cred_expire=$CRED_EXPIRE_S
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
EnforcePartLimits=ALL
SchedulerParameters=bf_interval=1,sched_interval=1
MinJobAge=5
MpiDefault=none
MailProg=/bin/true
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
NodeName=node[1-2] NodeHostname=localhost NodeAddr=127.0.0.1 Port=$NODE_PORT-$((NODE_PORT + 1)) CPUs=2 RealMemory=$mem
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
    echo "export SLURM_CONF=$CONF" >"$DIR/env"
    [[ -s $DIR/munge/munge.key ]] || mungekey -c -k "$DIR/munge/munge.key" >/dev/null
    chmod 0600 "$DIR/munge/munge.key"
}

# Report a failed start with the end of each log, and stop what was started.
fail_with_logs() {
    echo "slurm-local: error: $1" >&2
    local f
    for f in "$DIR"/log/*.log; do
        [[ -f $f ]] && { echo "--- tail $f" >&2; tail -n 6 "$f" >&2; }
    done
    SLURM_CONF=$CONF timeout 5 sinfo -N >&2 2>&1 || true
    stop_daemons
    exit 1
}

up() {
    ensure_packages
    ensure_hosts
    if all_alive && nodes_in 'idle|alloc|mix|comp'; then  # running jobs are fine
        say "already up ($DIR)"; return 0
    fi
    stop_daemons quiet  # leftovers of a half-started cluster
    write_config
    say "starting munged, slurmctld, slurmd ${NODES[*]} in $DIR"
    munged --socket="$MUNGE_SOCKET" --key-file="$DIR/munge/munge.key" --pid-file="$DIR/run/munged.pid" \
        --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/munge.seed" \
        || fail_with_logs "munged did not start"
    slurmctld -f "$CONF" -c || fail_with_logs "slurmctld did not start"
    local n
    for n in "${NODES[@]}"; do slurmd -f "$CONF" -N "$n" || fail_with_logs "slurmd -N $n did not start"; done
    local deadline=$((SECONDS + WAIT_S))
    until nodes_in idle; do
        ((SECONDS < deadline)) || fail_with_logs "nodes not idle after ${WAIT_S}s"
        all_alive || { sleep 0.5; all_alive || fail_with_logs "a daemon died during start"; }
        sleep 0.2
    done
    say "up: ${NODES[*]} idle; use: source $DIR/env"
}

# TERM daemons by their pid files in stages (slurmd, slurmctld, munged: each may still talk to the next), wait, KILL leftovers.
stop_daemons() {
    local quiet=${1:-} stage name pidfile binary pid
    for stage in slurmd slurmctld munged; do
        local pids=() names=()
        while IFS='|' read -r name pidfile binary; do
            [[ $name == "$stage"* ]] || continue
            if pid=$(live_pid "$pidfile" "$binary"); then
                kill -TERM "$pid" 2>/dev/null || true
                pids+=("$pid"); names+=("$name")
            fi
            rm -f "$pidfile"
        done < <(daemons)
        [[ -z $quiet && ${#names[@]} -gt 0 ]] && say "stopping ${names[*]}"
        local i deadline=$((SECONDS + 10))
        for i in "${!pids[@]}"; do
            while running "${pids[$i]}" && ((SECONDS < deadline)); do sleep 0.1; done
            if running "${pids[$i]}"; then
                say "${names[$i]} (pid ${pids[$i]}) ignored TERM for 10s, sending KILL"
                kill -KILL "${pids[$i]}" 2>/dev/null || true
            fi
        done
    done
}

down() {
    if all_alive; then  # end running jobs first so that no slurmstepd outlives its slurmd
        SLURM_CONF=$CONF scancel --user="$(id -un)" 2>/dev/null || true
        local deadline=$((SECONDS + 10))
        while [[ -n $(SLURM_CONF=$CONF squeue -h -o %i 2>/dev/null) ]] && ((SECONDS < deadline)); do
            sleep 0.2
        done
    fi
    stop_daemons
    say "down ($DIR)"
}

status() {
    local name pidfile binary pid rc=0
    while IFS='|' read -r name pidfile binary; do
        if pid=$(live_pid "$pidfile" "$binary"); then say "$name running (pid $pid)"
        else say "$name not running"; rc=1; fi
    done < <(daemons)
    if [[ $rc == 0 ]]; then SLURM_CONF=$CONF sinfo -N || rc=1; fi
    return $rc
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    status) status ;;
    *) echo "usage: $0 up|down|status   (dir: \$TORCHSTAGE_SLURM_DIR, default $REPO/.slurm-local)" >&2; exit 2 ;;
esac
