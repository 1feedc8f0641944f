#!/usr/bin/env bash
# slurm_up.sh — a one-node Slurm cluster on localhost for the tests (Debian 12, root, no systemd).
# Based on the verified recipe in shared/recipes/slurm-localhost. Idempotent: stops daemons it
# started before, wipes Slurm state, rewrites /etc/slurm/slurm.conf, starts munged, slurmctld, slurmd.
#   SLURM_CI_DIR  state, spool, logs, pid files (default /tmp/dfm-slurm)
#   SLURM_CI_CPUS CPUs to advertise per node (default 4: the tests oversubscribe a 2-core machine)
#   SLURM_CI_NODES nodes (default 1: this host under its own name). N > 1: nodes dfm-n1..dfm-nN, one
#                 slurmd each (`slurmd -N dfm-nI`, Slurm's multiple-slurmd mode), all on this host
#                 (NodeHostname = this host, NodeAddr 127.0.0.1, ports SLURM_CI_PORT+1.., default 6830),
#                 so that a job's tasks are split across nodes as on a cluster: one slurmstepd and one
#                 PMIx server per node, SLURM_NODEID/SLURM_LOCALID per node, Open MPI between nodes
#                 over TCP. The nodes share this host's file system, PIDs and hostname.
#   SLURM_CI_GPUS fake GPUs to advertise (default 0): gres/gpu backed by /dev/tty0.. (the trick of Slurm's
#                 own test suite), or by character devices made under SLURM_CI_DIR/dev where this host
#                 lacks them, so --gpus-per-task, --gres=gpu:N and the CUDA_VISIBLE_DEVICES that srun
#                 gives each task can be tested without GPUs; fails if it can make neither
set -euo pipefail
# The daemons started here must not inherit the callers' descriptors: a test's lock (`exec 9>LOCK`) or
# flock(1)'s would be held by munged or slurmctld for as long as they run, and a test killed before its
# cleanup left every later Slurm test waiting for that lock. So this shell closes every descriptor but
# 0-2 (and 255, bash's own) before it starts anything.
for fd in /proc/$$/fd/*; do
  fd=${fd##*/}
  case $fd in 0 | 1 | 2 | 255) ;; *) eval "exec $fd>&-" 2>/dev/null || true ;; esac
done
DIR=${SLURM_CI_DIR:-/tmp/dfm-slurm}
HERE=$(cd "$(dirname "$0")" && pwd)
die() { echo "[slurm_up] ERROR: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root (a localhost cluster needs to start daemons)"
for p in munge slurmctld slurmd slurm-client; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || die "package $p missing: run 'make deps'"
done

# munge: key and folders owned by the munge user; /run/munge does not exist without systemd
install -d -o munge -g munge -m 0700 /etc/munge /var/log/munge
install -d -o munge -g munge -m 0755 /run/munge
install -d -o munge -g munge -m 0711 /var/lib/munge
[ -s /etc/munge/munge.key ] || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
chown munge:munge /etc/munge/munge.key; chmod 0600 /etc/munge/munge.key
mkdir -p "$DIR"
if ! munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
  runuser -u munge -- /usr/sbin/munged
  for _ in $(seq 100); do munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
  munge -n </dev/null | unmunge >/dev/null || die "munged does not start; see /var/log/munge/munged.log"
  cp /run/munge/munged.pid "$DIR/munged.pid.ours"
fi

# leftovers of an earlier start
for pf in "$DIR/slurmctld.pid" "$DIR/slurmd.pid" "$DIR"/slurmd-*.pid; do
  if [ -s "$pf" ] && kill -0 "$(cat "$pf")" 2>/dev/null; then KEEP_MUNGE=1 "$HERE/slurm_down.sh" >/dev/null; break; fi
done
rm -rf "$DIR/state" "$DIR/spool"; mkdir -p "$DIR/state" "$DIR/spool" "$DIR/log" /etc/slurm

HW=$(slurmd -C | head -n 1)
NODE=$(sed -n 's/^NodeName=\([^ ]*\).*/\1/p' <<<"$HW")
MEM=$(sed -n 's/.* RealMemory=\([0-9]*\).*/\1/p' <<<"$HW")
CPUS=${SLURM_CI_CPUS:-4}
NNODES=${SLURM_CI_NODES:-1} PORT0=${SLURM_CI_PORT:-6830}
[[ $NNODES =~ ^[1-9][0-9]*$ ]] && [ "$NNODES" -le 16 ] || die "SLURM_CI_NODES=$NNODES: 1 to 16"
if [ "$NNODES" = 1 ]; then
  NODES=("$NODE")
  NODELINES="NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM@GRES@ State=UNKNOWN"
  SLURMD_FILES="SlurmdSpoolDir=$DIR/spool
SlurmdPidFile=$DIR/slurmd.pid
SlurmdLogFile=$DIR/log/slurmd.log"
else # one slurmd per node name: %n in the file names keeps their spool, pid and log files apart, and in
     # TmpFS the PMIx client folders (spmix_appdir_UID_JOB.STEP, one per node of a step)
  NODES=() NODELINES=""
  for i in $(seq "$NNODES"); do
    NODES+=("dfm-n$i")
    NODELINES+="NodeName=dfm-n$i NodeHostname=$NODE NodeAddr=127.0.0.1 Port=$((PORT0 + i)) CPUs=$CPUS RealMemory=$MEM@GRES@ State=UNKNOWN"$'\n'
  done
  SLURMD_FILES="SlurmdSpoolDir=$DIR/spool/%n
SlurmdPidFile=$DIR/slurmd-%n.pid
SlurmdLogFile=$DIR/log/slurmd-%n.log
TmpFS=$DIR/tmp/%n"
fi
GPUS=${SLURM_CI_GPUS:-0} GRES="" GRESTYPES=""
[[ $GPUS =~ ^[0-9]+$ ]] && [ "$GPUS" -le 8 ] || die "SLURM_CI_GPUS=$GPUS: 0 to 8"
if [ "$GPUS" -gt 0 ]; then
  # the device files: /dev/tty0.. where they all exist, else our own (a character device: /dev/null's numbers)
  DEVS=/dev/tty
  for i in $(seq 0 $((GPUS - 1))); do [ -c "/dev/tty$i" ] || DEVS=$DIR/dev/gpu; done
  if [ "$DEVS" != /dev/tty ]; then
    mkdir -p "$DIR/dev"
    for i in $(seq 0 $((GPUS - 1))); do
      [ -c "$DEVS$i" ] || mknod "$DEVS$i" c 1 3 ||
        die "no /dev/tty$i and mknod $DEVS$i failed: cannot make $GPUS fake GPUs. HINT: run as root with CAP_MKNOD, or SLURM_CI_GPUS=0"
    done
  fi
  [ -f /etc/slurm/gres.conf ] && ! grep -q 'dfm tests' /etc/slurm/gres.conf && cp -p /etc/slurm/gres.conf "/etc/slurm/gres.conf.orig.$(date +%s)"
  printf '# written by dfm tests/slurm/slurm_up.sh (dfm tests): fake GPUs\nName=gpu File=%s[0-%d]\n' "$DEVS" $((GPUS - 1)) > /etc/slurm/gres.conf
  GRES=" Gres=gpu:$GPUS" GRESTYPES="GresTypes=gpu"
elif grep -q 'dfm tests' /etc/slurm/gres.conf 2>/dev/null; then
  rm -f /etc/slurm/gres.conf
fi
[ -f /etc/slurm/slurm.conf ] && ! grep -q 'dfm tests' /etc/slurm/slurm.conf && cp -p /etc/slurm/slurm.conf "/etc/slurm/slurm.conf.orig.$(date +%s)"
cat > /etc/slurm/slurm.conf <<CONF
# written by dfm tests/slurm/slurm_up.sh (dfm tests): one node on localhost
ClusterName=dfm-ci
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$DIR/state
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
$SLURMD_FILES
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0
DependencyParameters=kill_invalid_depend
EnforcePartLimits=ALL
MpiDefault=pmix
MailProg=/bin/true
ReturnToService=2
MinJobAge=600
KillWait=5
SlurmdParameters=config_overrides
$GRESTYPES
${NODELINES//@GRES@/$GRES}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
/usr/sbin/slurmctld || die "slurmctld failed: $(tail -n 20 "$DIR/log/slurmctld.log")"
if [ "$NNODES" = 1 ]; then
  /usr/sbin/slurmd || die "slurmd failed: $(tail -n 20 "$DIR/log/slurmd.log")"
else
  for n in "${NODES[@]}"; do
    mkdir -p "$DIR/spool/$n" "$DIR/tmp/$n"
    /usr/sbin/slurmd -N "$n" || die "slurmd -N $n failed: $(tail -n 20 "$DIR/log/slurmd-$n.log")"
  done
fi
LIST=$(IFS=,; echo "${NODES[*]}")
idle() { [ "$(sinfo -h -n "$LIST" -o %T 2>/dev/null | sort -u)" = idle ] && [ "$(sinfo -h -N -n "$LIST" -o %N | wc -l)" = "$NNODES" ]; }
for _ in $(seq 600); do idle && break; sleep 0.1; done
idle || die "nodes $LIST not all idle ($(sinfo -h -N -n "$LIST" -o '%N=%T' | xargs)); see $DIR/log/"
echo "[slurm_up] node${NODES[1]:+s} $LIST idle with $CPUS CPUs${NODES[1]:+ each}${GRES:+ and $GPUS fake GPUs}"
