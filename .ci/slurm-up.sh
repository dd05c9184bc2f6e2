#!/usr/bin/env bash
# Start a one-node SLURM (Debian's slurmctld, slurmd and munge) on this machine, for the sweep tests
# that submit through the real sbatch. Idempotent: does nothing if `sinfo` already answers.
# Recipe: SLURM 22.05 on Debian bookworm, one node named after this host, partition "debug",
# no GPUs (no gres) and no accounting database. Run as root. Stop with .ci/slurm-down.sh.
set -euo pipefail
if sinfo -h >/dev/null 2>&1 && srun -N1 -n1 true >/dev/null 2>&1; then exit 0; fi
if ! command -v slurmctld >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurmctld slurmd slurm-client munge >/dev/null
fi
mkdir -p /etc/munge /run/munge /var/lib/munge /var/log/munge /var/spool/slurmctld /var/spool/slurmd \
  /var/log/slurm /etc/slurm
[ -f /etc/munge/munge.key ] || dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null
chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge
chmod 400 /etc/munge/munge.key
pgrep -x munged >/dev/null || su -s /bin/sh munge -c /usr/sbin/munged
host=$(hostname)
mem_mb=$(( $(free -m | awk '/Mem/{print $2}') - 1024 ))
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=local
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
NodeName=$host CPUs=$(nproc) RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
pgrep -x slurmctld >/dev/null || slurmctld
pgrep -x slurmd >/dev/null || slurmd
for _ in $(seq 1 30); do
  if srun -N1 -n1 true >/dev/null 2>&1; then sinfo; exit 0; fi
  sleep 1
done
echo "slurm-up: the one-node SLURM did not answer within 30 s (see /var/log/slurm)" >&2
exit 1
