"""Every FAULTLENS_* environment variable: its name, default, type, who reads it and what it means
(modelled on opentelemetry-python's sdk/environment_variables, with the declaration as data). Code
reads these variables only through the EnvVar objects here (tests/test_environment.py checks it),
and docs/environment.md is generated from this module:

    python -m faultlens.environment > docs/environment.md

The training process imports this module (step timer, heartbeat, dump trigger): it imports only the
standard library's os, dataclasses and collections.abc.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

PREFIX = "FAULTLENS_"
_FALSE = ("0", "false", "no", "off")


@dataclass(frozen=True)
class EnvVar:
    """One variable. `default` is what an unset (or, where `empty_is_unset`, empty) variable means,
    as text;
    None: no default (the feature is off or the caller decides)."""

    name: str
    type: str  # path, paths, url, int, bool, text, json, name
    default: str | None
    # where it is read: training process, node agent, CLI, supervisor, lab, demo, hooks
    readers: str
    meaning: str

    def raw(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The variable's text as set (empty included), None when unset."""
        return (os.environ if environ is None else environ).get(self.name)

    def get(
        self, environ: Mapping[str, str] | None = None, default: str | None = None
    ) -> str | None:
        """The text when set and not empty, else `default` (else the declared default)."""
        value = self.raw(environ)
        if value:
            return value
        return default if default is not None else self.default

    def get_int(
        self, environ: Mapping[str, str] | None = None, default: int | None = None
    ) -> int | None:
        """An integer; a value that is not one gives `default` (else the declared default)."""
        fallback = (
            default
            if default is not None
            else (int(self.default) if self.default is not None else None)
        )
        value = (self.raw(environ) or "").strip()
        if not value:
            return fallback
        try:
            return int(value)
        except ValueError:
            return fallback

    def get_bool(self, environ: Mapping[str, str] | None = None) -> bool | None:
        """True/False when set (0, false, no, off are False), None when unset or empty."""
        value = (self.raw(environ) or "").strip().lower()
        return None if not value else value not in _FALSE

    def is_set(self, environ: Mapping[str, str] | None = None) -> bool:
        return self.name in (os.environ if environ is None else environ)


def _var(name: str, type_: str, default: str | None, readers: str, meaning: str) -> EnvVar:
    variable = EnvVar(PREFIX + name, type_, default, readers, " ".join(meaning.split()))
    _ALL[variable.name] = variable
    return variable


_ALL: dict[str, EnvVar] = {}

# ---------------------------------------------------------------- identity (every collector)
NODE = _var("NODE", "name", None, "training process, node agent, dump trigger, supervisor",
            "The node name stamped on every row; unset: the hostname. The supervisor sets it per "
            "torchrun agent.")
CLUSTER = _var("CLUSTER", "name", None, "training process, node agent", "The cluster name stamped "
                                                                        "on every row.")
JOB_ID = _var("JOB_ID", "name", None, "training process, node agent, demo",
              "The job id; unset: torchrun's TORCHELASTIC_RUN_ID.")
ATTEMPT = _var("ATTEMPT", "int", None, "training process, node agent, demo, lab, supervisor",
               "The attempt number when a supervisor restarts torchrun itself; unset: "
               "TORCHELASTIC_RESTART_COUNT.")

# ---------------------------------------------------------------- store, rules
STORE = _var("STORE", "url", "./faultlens-store", "CLI, training process (step timer)",
             "The store directory or URL (file://, s3://, ...). The step timer without one counts "
             "and drops rows.")
RULES = _var("RULES", "path", None, "every command that reads rules, the processes they start",
             "A directory of rule files that replace the shipped ones of the same name, file by "
             "file (what "
             "`--rules DIR` sets); a directory that does not exist makes rule files unreadable, "
             "never silently the "
             "shipped ones.")
XID_CATALOG = _var("XID_CATALOG", "path", None, "attribution engine, CLI",
                   "A user's copy of rules/xid.yaml that replaces the shipped catalog "
                   "(--xid-catalog wins).")
SECTION_VOCABULARY = _var("SECTION_VOCABULARY", "paths", None, "straggler detector",
                          "Extra section-vocabulary files (os.pathsep-separated), after "
                          "rules/comm_ops.yaml; later "
                          "files win.")

# ---------------------------------------------------------------- inside the training process
HEARTBEAT_DIR = _var("HEARTBEAT_DIR", "path", "/dev/shm/faultlens-heartbeats", "training process "
                                                                               "(step timer)",
                     "Where each rank's heartbeat file is written (else under the temp directory); "
                     "set but empty: "
                     "no heartbeat.")
TOTAL_STEPS = _var("TOTAL_STEPS", "int", None, "training process (step timer), supervisor",
                   "The steps the job will run (its ranks row's total_steps); with the recent step "
                   "time it gives "
                   "the job's remaining time the straggler policy weighs. `faultlens run "
                   "--total-steps` sets it.")
FR_DIR = _var("FR_DIR", "path", None, "training process (dump trigger)",
              "Where the ranks write flight-recorder dumps; unset: no dump trigger is installed.")
FR_TRIGGER = _var("FR_TRIGGER", "path", None, "training process (dump trigger)",
                  "A file the ranks poll; touching it asks every rank for a flight-recorder dump.")
FR_EXIT_DIR = _var("FR_EXIT_DIR", "path", None, "training process (dump trigger)",
                   "Where a rank writes a dump as it exits on an error.")
FR_STACK_TRACES = _var("FR_STACK_TRACES", "bool", "1", "training process (dump trigger)",
                       "0 turns Python stack traces in dumps off (the first dump with them imports "
                       "torch._dynamo, "
                       "about 1 s of CPU).")
FR_DUMP_ON_SIGTERM = _var("FR_DUMP_ON_SIGTERM", "bool", "0", "training process (dump trigger)",
                          "1: a rank dumps its flight recorder when it gets SIGTERM.")

# ---------------------------------------------------------------- flight-recorder reader limits
FR_MAX_FILE_BYTES = _var("FR_MAX_FILE_BYTES", "int", str(256 * 1024 * 1024), "dump reader",
                         "A bigger dump file is not read at all.")
FR_MAX_WORLD_SIZE = _var("FR_MAX_WORLD_SIZE", "int", str(2 ** 18), "dump reader",
                         "The largest world size (and rank) a dump may name.")
FR_MAX_STRING_BYTES = _var("FR_MAX_STRING_BYTES", "int", str(4 * 1024 * 1024), "dump reader",
                           "The longest string or bytes value in a dump.")
FR_MAX_ELEMENTS = _var("FR_MAX_ELEMENTS", "int", None, "dump reader",
                       "The most containers and elements a dump may hold (default: derived from "
                       "the file size).")
FR_MAX_ALLOC_BYTES = _var("FR_MAX_ALLOC_BYTES", "int", str(384 * 1024 * 1024), "dump reader",
                          "The most bytes of objects loading one dump may build (estimated "
                          "before the load).")
FR_MAX_SET_BYTES = _var("FR_MAX_SET_BYTES", "int", str(1 << 30), "dump reader",
                        "The dump bytes one set reads at least (8 MiB a dump beyond); the "
                        "largest files beyond it are refused unread.")

# ---------------------------------------------------------------- CLI
PROGRESS = _var("PROGRESS", "bool", None, "CLI",
                "0/1 forces progress bars off/on; unset: only on a terminal.")

# ---------------------------------------------------------------- supervisor, restore, checkpoints
# (the job's script)
RESTORE_PLAN = _var("RESTORE_PLAN", "path", None, "the job's training script "
                                                  "(controller/restore.py)",
                    "The restore plan the supervisor wrote for this attempt; unset: a first start.")
CKPT_LOCAL = _var("CKPT_LOCAL", "path", None, "demo and lab training scripts",
                  "The node-local checkpoint tier's directory.")
CKPT_DURABLE = _var("CKPT_DURABLE", "url", None, "demo and lab training scripts",
                    "The durable (shared) checkpoint tier's directory or URL.")

# ---------------------------------------------------------------- decision hooks
DECISION_ID = _var("DECISION_ID", "name", None, "command hooks (set by faultlens for the hook's "
                                                "program)",
                   "The decision id, in a command hook's environment.")
DECISION_ACTION = _var("DECISION_ACTION", "name", None, "command hooks (set by faultlens for the "
                                                        "hook's program)",
                       "The decision's action (failover, escalate, notify, drain), in a command "
                       "hook's environment.")
WEBHOOK_SECRET = _var("WEBHOOK_SECRET", "text", None, "faultlens decide",
                      "The webhook's HMAC secret (the default of --webhook-secret-env).")

# ---------------------------------------------------------------- demo
DEMO_DIR = _var("DEMO_DIR", "path", ".", "demo training script", "Where the demo's fault markers "
                                                                 "are written.")
DEMO_FAULT = _var("DEMO_FAULT", "json", None, "demo training script",
                  "The fault of this attempt (a JSON object), from the supervisor.")
DEMO_FAULTS = _var("DEMO_FAULTS", "json", None, "demo training script",
                   "Faults per restart (a JSON list indexed by the attempt), under plain torchrun.")
RESUME_LATEST = _var("RESUME_LATEST", "bool", None, "demo training script",
                     "1: resume from the newest complete checkpoint by itself (no supervisor).")

# ---------------------------------------------------------------- fault-injection campaign
# (controller/lab)
LAB_DIR = _var("LAB_DIR", "path", None, "lab (injected processes)",
               "The scenario's directory; unset: the lab's sitecustomize does nothing.")
LAB_PLAN = _var("LAB_PLAN", "path", None, "lab (injected processes)", "The scenario's injection "
                                                                      "plan (JSON).")
LAB_SUPERVISOR = _var("LAB_SUPERVISOR", "bool", None, "lab", "1 in the supervisor the campaign "
                                                             "runner starts.")

# ---------------------------------------------------------------- notebooks, deploy examples
# (docs/deploy/)
JOB = _var("JOB", "name", None, "notebooks (triage, goodput), docker-compose",
           "The job the notebooks show; unset: the job with the newest step.")
NOTEBOOK_OUT = _var("NOTEBOOK_OUT", "path", "outputs", "notebooks", "Where the notebooks write "
                                                                    "their plots as PNG.")
RESTORE_TIER = _var("RESTORE_TIER", "name", None, "the job's training script (set by docs/deploy "
                                                  "hooks)",
                    "The checkpoint tier a failover restores from (set by the slurm/torchrun "
                    "examples).")
RESTORE_STEP = _var("RESTORE_STEP", "int", None, "the job's training script (set by docs/deploy "
                                                 "hooks)",
                    "The checkpoint step a failover restores from.")
RESTORE_URI = _var("RESTORE_URI", "url", None, "the job's training script (set by docs/deploy "
                                               "hooks)",
                   "The checkpoint a failover restores from.")
DECISION_WAIT = _var("DECISION_WAIT", "int", "300", "docs/deploy/torchrun/faultlens-torchrun.sh",
                     "Seconds the torchrun wrapper waits for a decision after a failure.")
DECISION_SPOOL = _var("DECISION_SPOOL", "path", "/var/spool/faultlens/decisions",
                      "docs/deploy/torchrun/faultlens-torchrun.sh",
                      "The file hook's spool the wrapper reads decisions from.")
MAX_ATTEMPTS = _var("MAX_ATTEMPTS", "int", "10", "docs/deploy/torchrun/faultlens-torchrun.sh",
                    "The most attempts the torchrun wrapper starts.")
TORCHRUN = _var("TORCHRUN", "text", "torchrun", "docs/deploy/torchrun/faultlens-torchrun.sh",
                "The launcher command the wrapper runs.")
RESTORE_DECISION = _var("RESTORE_DECISION", "name", None,
                        "the job's training script (set by `faultlens slurm run`)",
                        "The decision that chose the restore point in FAULTLENS_RESTORE_STEP.")
RECEIVER_STATE = _var("RECEIVER_STATE", "path", "/var/lib/faultlens-receiver/handled.jsonl",
                      "docs/deploy/kubernetes/webhook_receiver.py",
                      "The webhook receiver's record of handled decisions.")

VARIABLES: tuple[EnvVar, ...] = tuple(_ALL.values())


def by_name(name: str) -> EnvVar:
    """The declaration of `name`; KeyError for a variable nobody declared."""
    return _ALL[name]


def without_faultlens(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` less every FAULTLENS_* variable (a child process that must not inherit this one's).
    """
    return {k: v for k, v in environ.items() if not k.startswith(PREFIX)}


def markdown() -> str:
    """docs/environment.md."""
    lines = ["# Environment variables", "",
             "Generated from `faultlens/environment.py` "
             "(`python -m faultlens.environment > docs/environment.md`); "
             "tests/test_environment.py checks that this page matches it.", "",
             "| variable | type | default | read by | meaning |", "| --- | --- | --- | --- | --- |"]
    for v in VARIABLES:
        default = "(none)" if v.default is None else f"`{v.default}`"
        lines.append(f"| `{v.name}` | {v.type} | {default} | {v.readers} | {v.meaning} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # pragma: no cover
    print(markdown(), end="")
