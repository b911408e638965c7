"""A process that installs the flight-recorder trigger and then blocks its main thread in a C-level
wait (as a rank blocked in a gloo/NCCL wait does), so the signal and trigger-file paths can be
exercised without torch.

    python trigger_probe.py DUMP_DIR EXIT_DIR TRIGGER_FILE RANK [timer-first]

The dump API and group tables are fixed stand-ins (torch's boundary); it prints 'ready' when
installed, and waits up to 60 s. A Python-level SIGUSR1 handler is also installed, to show it never
runs while the main thread waits. With `timer-first`, a step timer (and its writer thread) is
started before the trigger is installed.
"""

from __future__ import annotations

import json
import pickle
import signal
import sys
import threading

from faultlens.collectors.training.fr_trigger import FlightRecorderTrigger
from faultlens.collectors.training.step_timer import RankIdentity, StepTimer

TRACE = {
    "version": "2.10",
    "pg_config": {"": {"name": "", "desc": "", "ranks": "[]"}},
    "pg_status": {
        "0": {
            "last_enqueued_collective": 4,
            "last_started_collective": -1,
            "last_completed_collective": 3,
        }
    },
    "comm_lib_version": "",
    "entries": [
        {
            "record_id": 0,
            "pg_id": 0,
            "process_group": ("0", "default_pg"),
            "collective_seq_id": 4,
            "profiling_name": "gloo:all_reduce",
            "state": "scheduled",
            "retired": False,
        }
    ],
}


def dump_api(include_stack_traces: bool, only_active: bool) -> tuple[bytes, str]:
    as_json = dict(
        TRACE, entries=[dict(e, process_group=list(e["process_group"])) for e in TRACE["entries"]]
    )
    return pickle.dumps(TRACE, protocol=2), json.dumps(as_json)


def group_tables() -> dict[str, dict[str, str]]:
    return {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"}}


def main() -> None:
    dump_dir, exit_dir, trigger_file, rank = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    timer = (
        StepTimer(None, identity=RankIdentity(rank=rank))
        if sys.argv[5:] == ["timer-first"]
        else None
    )
    trigger = FlightRecorderTrigger(
        dump_dir,
        exit_dump_dir=exit_dir,
        trigger_file=trigger_file,
        rank=rank,
        world_size=4,
        node="probe-node",
        dump_on_sigterm=True,
        poll_interval_s=0.05,
        dump_api=dump_api,
        group_tables=group_tables,
    )
    trigger.install()
    handled = []
    signal.signal(signal.SIGUSR1, lambda *_: handled.append(1))  # blocked: must never run
    print("ready", flush=True)
    threading.Event().wait(60)  # a lock wait in C, like a collective's wait
    print(f"python handler ran {len(handled)} times", flush=True)
    if timer is not None:
        timer.close()


if __name__ == "__main__":
    main()
