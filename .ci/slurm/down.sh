#!/usr/bin/env bash
# Stop the one-node test Slurm started by .ci/slurm/up.sh.
#
#   bash .ci/slurm/down.sh [STATE_DIR] [--purge]    (default STATE_DIR=/tmp/perfkit-slurm)
#
# Cancels remaining jobs, then stops slurmd, slurmctld, slurmdbd, mariadbd and munged
# (SIGTERM, then SIGKILL after a grace period).  Only processes whose pid is recorded
# under STATE_DIR are touched.  --purge also deletes STATE_DIR (config, database, logs).
set -uo pipefail

STATE=/tmp/perfkit-slurm
PURGE=0
for a in "$@"; do
  case "$a" in
    --purge) PURGE=1 ;;
    *) STATE=$a ;;
  esac
done
RUN=$STATE/run
say() { echo "[slurm-down] $*"; }

[ -d "$STATE" ] || { say "nothing to do: $STATE does not exist"; exit 0; }

alive() {
  local pid
  [ -f "$1" ] || return 1
  pid=$(cat "$1" 2>/dev/null) || return 1
  [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ] || return 1
  [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ]   # zombies are dead
}

stop() {  # stop PIDFILE NAME
  local pidf=$1 name=$2 pid i
  [ -e "$pidf" ] || { say "$name not running"; return 0; }
  if ! alive "$pidf" "$name"; then say "$name not running"; rm -f "$pidf"; return 0; fi
  pid=$(cat "$pidf")
  kill -TERM "$pid" 2>/dev/null
  for i in $(seq 1 60); do
    alive "$pidf" "$name" || { say "$name stopped (pid $pid)"; rm -f "$pidf"; return 0; }
    sleep 0.5
  done
  kill -KILL "$pid" 2>/dev/null
  sleep 0.5
  say "$name killed after 30 s (pid $pid)"
  rm -f "$pidf"
}

if [ -f "$STATE/etc/slurm.conf" ] && alive "$RUN/slurmctld.pid" slurmctld; then
  export SLURM_CONF=$STATE/etc/slurm.conf
  jobs=$(timeout 10 squeue -h -o %i 2>/dev/null | tr '\n' ' ')
  if [ -n "${jobs// /}" ]; then
    timeout 10 scancel $jobs 2>/dev/null
    for i in $(seq 1 20); do
      [ -z "$(timeout 10 squeue -h -t PD,R,CG -o %i 2>/dev/null)" ] && break
      sleep 0.5
    done
    say "cancelled jobs: $jobs"
  fi
fi

stop "$RUN/slurmd.pid" slurmd
stop "$RUN/slurmctld.pid" slurmctld
stop "$RUN/slurmdbd.pid" slurmdbd
if alive "$RUN/mariadbd.pid" mariadbd; then
  pid=$(cat "$RUN/mariadbd.pid")
  # A clean InnoDB shutdown; stop() below only cleans up (or kills it if this hung).
  timeout 30 mariadb-admin --no-defaults --socket="$STATE/mysql/mysqld.sock" -uroot shutdown >/dev/null 2>&1 \
    && ! alive "$RUN/mariadbd.pid" mariadbd && { say "mariadbd stopped (pid $pid)"; rm -f "$RUN/mariadbd.pid"; }
fi
[ -e "$RUN/mariadbd.pid" ] && stop "$RUN/mariadbd.pid" mariadbd
stop "$STATE/munge/munged.pid" munged

if [ "$PURGE" = 1 ]; then
  rm -rf "$STATE" && say "removed $STATE"
fi
say "done"
