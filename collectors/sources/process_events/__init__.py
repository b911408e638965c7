"""The process source: what happened to the rank processes of a job, as process_events rows
(interface 3).

Inputs, each a function of values (no argparse, no store):
- exits and starts seen by a supervising process (`exit_row`, `start_row`;
  ProcessSource.record_exit/start),
- torchrun's stderr: its failure report (Failures / Root Cause) and the workers' lines it tees
  (`rows_from_torchrun_output`),
- torchrun's --log-dir tree: <run>_<suffix>/attempt_<n>/<local rank>/{error.json, stderr.log}
  (`rows_from_log_dir`),
- an error file: a worker's error.json or the TORCHELASTIC_ERROR_FILE torchrun writes
  (`rows_from_error_file`).

Error text is classified by rules/process_errors.yaml: CUDA OOM -> kind oom; gloo timeouts,
"Connection closed by peer" and NCCL watchdog lines -> comm_error / watchdog_timeout marked
secondary (a survivor's echo). SIGTERM deaths in a torchrun report are secondary (torchrun sent
them). Exceptions carry a fingerprint (faultlens.collectors.artifacts.fingerprint). Bad input raises
ProcessEventsError naming the file; `collect_paths` keeps the good files' rows and lists errors.

The modules, in reading order: rows (the table's vocabularies, EventContext, the error, the row
builders), error_file (error.json and torchrun's error file), stderr (worker lines grouped by
worker, one worker's lines into rows), torchrun (torchrun's stderr: failure reports and teed lines,
attempt by attempt), log_dirs (torchrun --log-dir trees), collect (collect_paths over any mix of
inputs) and process_source (ProcessSource, the node agent's Source).
"""

from __future__ import annotations

from faultlens.collectors.sources.process_events.collect import (
    CollectResult,
    collect_paths,
    looks_like_error_file,
)
from faultlens.collectors.sources.process_events.error_file import rows_from_error_file
from faultlens.collectors.sources.process_events.log_dirs import (
    STDERR_TAIL_BYTES,
    WorkerLogDir,
    find_worker_dirs,
    rows_from_worker_dir,
)
from faultlens.collectors.sources.process_events.process_source import ProcessSource
from faultlens.collectors.sources.process_events.rows import (
    TABLE,
    EventContext,
    ProcessEventsError,
    Source,
    SupervisorKind,
    agent_exit_row,
    error_row,
    exit_row,
    signal_name,
    signal_sent_row,
    start_row,
)
from faultlens.collectors.sources.process_events.stderr import (
    rows_from_stream,
    split_worker_streams,
)
from faultlens.collectors.sources.process_events.torchrun import rows_from_torchrun_output

__all__ = [
    "STDERR_TAIL_BYTES",
    "TABLE",
    "CollectResult",
    "EventContext",
    "ProcessEventsError",
    "ProcessSource",
    "Source",
    "SupervisorKind",
    "WorkerLogDir",
    "agent_exit_row",
    "collect_paths",
    "error_row",
    "exit_row",
    "find_worker_dirs",
    "looks_like_error_file",
    "rows_from_error_file",
    "rows_from_stream",
    "rows_from_torchrun_output",
    "rows_from_worker_dir",
    "signal_name",
    "signal_sent_row",
    "split_worker_streams",
    "start_row",
]
