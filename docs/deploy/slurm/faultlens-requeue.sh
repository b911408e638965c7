#!/usr/bin/env bash
# faultlens command hook for Slurm (a `type: command` hook, controller/hooks/command.py): the decision JSON
# (schema faultlens.decision/1) arrives on stdin.
#   failover  drain the excluded nodes, cancel the job's allocation, resubmit its batch script with
#             sbatch --exclude=<every node excluded from this job so far> and the checkpoint to restore in its
#             environment (FAULTLENS_RESTORE_TIER / _STEP / _URI) and the next FAULTLENS_ATTEMPT
#   drain     drain the nodes (a proactive decision: no job is touched)
#   escalate  leave the job stopped, write the reason into its comment; a human takes it from here
# The faultlens job id is the Slurm job name (stable across resubmissions). Deliveries are at-least-once: a
# decision already handled (by decision_id) is acknowledged and skipped.
# Environment (set it in the hook's `env:`):
#   FAULTLENS_SLURM_BATCH  the batch script to resubmit (required for failover)
#   FAULTLENS_SLURM_STATE  where exclusions, attempts and handled decision ids are kept (default
#                          /var/lib/faultlens/slurm)
#   FAULTLENS_SLURM_DRAIN  1 (default): drain excluded nodes cluster-wide; 0: only exclude them from this job
set -euo pipefail

state=${FAULTLENS_SLURM_STATE:-/var/lib/faultlens/slurm}
mkdir -p "$state"

# the decision's fields as shell variables
eval "$(python3 -c '
import json, shlex, sys
d = json.load(sys.stdin)
restore = d.get("restore") or {}
fields = {"DECISION_ID": d["decision_id"], "JOB": d.get("job_id") or "", "ACTION": d["action"],
          "EXCLUDE": ",".join(d.get("exclude_nodes") or []), "REASON": (d.get("reason") or "")[:200],
          "RESTORE_TIER": restore.get("tier") or "", "RESTORE_URI": restore.get("uri") or "",
          "RESTORE_STEP": "" if restore.get("step") is None else str(restore["step"])}
for key, value in fields.items():
    print(f"{key}={shlex.quote(value)}")
')"

if [[ ! $JOB =~ ^[A-Za-z0-9._-]+$ || ! $DECISION_ID =~ ^[A-Za-z0-9._-]+$ ]]; then
    echo "faultlens-requeue: decision ${DECISION_ID@Q} has no usable job id (${JOB@Q})" >&2
    exit 2
fi
handled="$state/$DECISION_ID.done"
if [[ -e $handled ]]; then
    echo "faultlens-requeue: $DECISION_ID already handled"
    exit 0
fi

drain_nodes() {
    if [[ ${FAULTLENS_SLURM_DRAIN:-1} == 1 && -n $1 ]]; then
        scontrol update NodeName="$1" State=DRAIN Reason="faultlens $DECISION_ID"
    fi
}

case $ACTION in
    drain)
        drain_nodes "$EXCLUDE"
        ;;
    escalate)
        for id in $(squeue -h --name "$JOB" -o %i); do
            scontrol update JobId="$id" Comment="faultlens escalated ($DECISION_ID): $REASON"
        done
        echo "faultlens-requeue: job $JOB escalated to a human: $REASON" >&2
        ;;
    failover)
        : "${FAULTLENS_SLURM_BATCH:?set FAULTLENS_SLURM_BATCH to the batch script to resubmit}"
        excluded="$state/$JOB.exclude"
        touch "$excluded"
        tr ',' '\n' <<<"$EXCLUDE" | sed '/^$/d' >>"$excluded"
        sort -u -o "$excluded" "$excluded"
        attempt=$(( $(cat "$state/$JOB.attempt" 2>/dev/null || echo 0) + 1 ))
        drain_nodes "$EXCLUDE"
        for id in $(squeue -h --name "$JOB" -o %i); do
            scancel "$id"
        done
        args=(--job-name "$JOB"
              --export "ALL,FAULTLENS_JOB_ID=$JOB,FAULTLENS_ATTEMPT=$attempt,FAULTLENS_RESTORE_TIER=$RESTORE_TIER,FAULTLENS_RESTORE_STEP=$RESTORE_STEP,FAULTLENS_RESTORE_URI=$RESTORE_URI")
        if [[ -s $excluded ]]; then
            args+=(--exclude "$(paste -sd, "$excluded")")
        fi
        sbatch "${args[@]}" "$FAULTLENS_SLURM_BATCH"
        echo "$attempt" >"$state/$JOB.attempt"
        ;;
    *)
        echo "faultlens-requeue: unknown action ${ACTION@Q} in $DECISION_ID" >&2
        exit 3
        ;;
esac
touch "$handled"
