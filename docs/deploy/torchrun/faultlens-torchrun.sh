#!/usr/bin/env bash
# Wrap torchrun on one node with faultlens decisions (for jobs without Slurm or Kubernetes controllers).
#   faultlens-torchrun.sh --nnodes 2:4 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint head:29500 train.py
# Runs torchrun with FAULTLENS_ATTEMPT set. When it fails, waits for faultlens' decision about this job and attempt
# in the decision spool (a `type: file` hook writes <decision_id>.json there; hooks.yaml) and acts on it:
#   failover, this node excluded      exit: the elastic rendezvous (--nnodes MIN:MAX) goes on without this node
#   failover                          restart torchrun with FAULTLENS_RESTORE_TIER/_STEP/_URI from the decision
#   escalate, or no decision in time  exit with torchrun's status: a human takes it from here
# Environment: FAULTLENS_JOB_ID (required), FAULTLENS_DECISION_SPOOL (default /var/spool/faultlens/decisions),
#   FAULTLENS_NODE (default: the host name), FAULTLENS_DECISION_WAIT (seconds, default 300),
#   FAULTLENS_MAX_ATTEMPTS (default 10), FAULTLENS_TORCHRUN (the launcher, default torchrun).
set -uo pipefail

: "${FAULTLENS_JOB_ID:?set FAULTLENS_JOB_ID}"
spool=${FAULTLENS_DECISION_SPOOL:-/var/spool/faultlens/decisions}
node=${FAULTLENS_NODE:-$(hostname)}
wait_s=${FAULTLENS_DECISION_WAIT:-300}
max_attempts=${FAULTLENS_MAX_ATTEMPTS:-10}
read -r -a launcher <<<"${FAULTLENS_TORCHRUN:-torchrun}"
attempt=${FAULTLENS_ATTEMPT:-0}

# prints "ACTION EXCLUDED TIER STEP URI" for this job and attempt's decision, or nothing
find_decision() {
    python3 - "$spool" "$FAULTLENS_JOB_ID" "$1" "$node" <<'PY'
import json, pathlib, sys
spool, job, attempt, node = pathlib.Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
for path in sorted(spool.glob("*.json")):
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError):
        continue
    if d.get("job_id") == job and d.get("attempt") == attempt:
        r = d.get("restore") or {}
        step = "" if r.get("step") is None else r["step"]
        print(d["action"], "yes" if node in (d.get("exclude_nodes") or []) else "no",
              r.get("tier") or "-", step if step != "" else "-", r.get("uri") or "-")
        break
PY
}

while (( attempt < max_attempts )); do
    export FAULTLENS_ATTEMPT=$attempt
    "${launcher[@]}" "$@"
    status=$?
    if (( status == 0 )); then
        exit 0
    fi
    echo "faultlens-torchrun: attempt $attempt failed (exit $status); waiting for a decision" >&2
    decision=""
    for (( waited = 0; waited < wait_s; waited++ )); do
        decision=$(find_decision "$attempt")
        [[ -n $decision ]] && break
        sleep 1
    done
    if [[ -z $decision ]]; then
        echo "faultlens-torchrun: no decision within ${wait_s}s; stopping" >&2
        exit "$status"
    fi
    read -r action excluded tier step uri <<<"$decision"
    case $action in
        failover)
            if [[ $excluded == yes ]]; then
                echo "faultlens-torchrun: $node is excluded from $FAULTLENS_JOB_ID; leaving the job" >&2
                exit 0
            fi
            [[ $tier != - ]] && export FAULTLENS_RESTORE_TIER=$tier
            [[ $step != - ]] && export FAULTLENS_RESTORE_STEP=$step
            [[ $uri != - ]] && export FAULTLENS_RESTORE_URI=$uri
            echo "faultlens-torchrun: failover: restarting from step ${step} (${tier})" >&2
            attempt=$(( attempt + 1 ))
            ;;
        *)
            echo "faultlens-torchrun: decision $action; stopping" >&2
            exit "$status"
            ;;
    esac
done
echo "faultlens-torchrun: $max_attempts attempts used; stopping" >&2
exit 1
