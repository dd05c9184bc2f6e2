#!/usr/bin/env bash
# Stop the one-node SLURM that .ci/slurm-up.sh started.
scontrol shutdown >/dev/null 2>&1 || true
pkill -x slurmd 2>/dev/null || true
pkill -x slurmctld 2>/dev/null || true
exit 0
