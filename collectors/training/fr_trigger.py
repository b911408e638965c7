"""Flight-recorder trigger inside the training process: on SIGUSR1 or a touched trigger file, write
this rank's flight-recorder dump (pickle and JSON) into a dump directory; optionally once more on
the way out of an exception.

Why a sigwait thread (reference/flight-recorder.md): a plain `signal.signal` handler only runs in
the main thread between bytecodes, and the main thread of a hung rank is blocked inside a gloo/NCCL
wait, so it never runs. Instead the signal is blocked with `pthread_sigmask` before
`init_process_group` (so every thread torch creates inherits the mask) and a daemon thread
`sigwait()`s for it and dumps while the main thread stays blocked.

Files (interface 4): `<dump_dir>/rank_<N>.pkl` (pickle protocol 2 of the dict torch's
`_dump_fr_trace` returns, with `pg_config` repaired from torch's group tables and top-level `rank`,
`world_size`, `node`) and `<dump_dir>/rank_<N>.json` (torch's JSON form with the same repairs); each
written to a temporary name and renamed. Beside them, `<dump_dir>/own-stacks/rank_<N>.json`: the
Python stacks of the process's other threads at that moment, in py-spy's JSON form (own_stack.py):
where the training thread is, without py-spy or ptrace.

With `dump_on_sigterm=True` SIGTERM is blocked too and the sigwait thread writes a dump into the
exit directory before letting SIGTERM end the process as it would have (torchrun SIGTERMs the
survivors of a failure, and they hold the evidence of which collective the culprit never joined).

Never raises into training: every failure is logged and counted in `stats`.

    # FAULTLENS_FR_DIR, FAULTLENS_FR_TRIGGER, FAULTLENS_FR_EXIT_DIR
    trigger = FlightRecorderTrigger.from_env()
    trigger.install()  # before dist.init_process_group
    dist.init_process_group("gloo")
    with trigger.dump_on_exception():
        train()
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from faultlens import environment
from faultlens.collectors.artifacts.safe_pickle import safe_loads
from faultlens.collectors.store.atomic import atomic_write
from faultlens.collectors.training.own_stack import OWN_STACKS_DIR, own_stacks

log = logging.getLogger(__name__)

ENV_DUMP_DIR = environment.FR_DIR.name
ENV_TRIGGER_FILE = environment.FR_TRIGGER.name
ENV_EXIT_DUMP_DIR = environment.FR_EXIT_DIR.name
ENV_STACK_TRACES = environment.FR_STACK_TRACES.name
ENV_DUMP_ON_SIGTERM = environment.FR_DUMP_ON_SIGTERM.name

#: what a dump API returns: (pickle bytes of the trace dict, JSON text of the trace dict)
DumpApi = Callable[[bool, bool], tuple[bytes, str]]
#: what a group-table reader returns: {pg name: {'name', 'desc', 'ranks': '[0, 1]'}}
GroupTables = Callable[[], dict[str, dict[str, str]]]


def torch_dump_api(include_stack_traces: bool, only_active: bool) -> tuple[bytes, str]:
    """The real boundary: torch's flight-recorder dump functions (torch >= 2.7 names, older NCCL
    names as fallback).
    """
    from torch._C import _distributed_c10d as c10d

    dump = getattr(c10d, "_dump_fr_trace", None) or c10d._dump_nccl_trace
    dump_json = getattr(c10d, "_dump_fr_trace_json", None) or c10d._dump_nccl_trace_json
    return dump(True, include_stack_traces, only_active), dump_json(True, only_active)


def torch_group_tables() -> dict[str, dict[str, str]]:
    """pg_config rebuilt from torch's own tables: every group this rank belongs to, keyed by group
    name, with global ranks (gloo records pg_config before groups are named: key '', ranks '[]',
    groups overwrite)."""
    from torch.distributed import distributed_c10d as c10d

    world = c10d._world
    config: dict[str, dict[str, str]] = {}
    for pg, name in list(world.pg_names.items()):
        ranks = sorted(world.pg_group_ranks.get(pg, {}).keys())
        desc = getattr(pg, "group_desc", "") or ""
        config[str(name)] = {"name": str(name), "desc": str(desc), "ranks": str(ranks)}
    return config


def repair_pg_config(
    recorded: Mapping[str, Any], tables: Mapping[str, Mapping[str, str]]
) -> dict[str, Any]:
    """torch's recorded pg_config with gloo's unnamed placeholder dropped and every group from
    `tables` set.
    """
    repaired = {
        key: value
        for key, value in recorded.items()
        if not (key == "" and isinstance(value, Mapping) and not value.get("name"))
    }
    for name, entry in tables.items():
        repaired[name] = dict(entry)
    return repaired


@dataclass
class TriggerStats:
    dumps: int = 0
    failures: int = 0
    last_error: str | None = None
    last_dump_s: float | None = None
    reasons: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class DumpResult:
    reason: str
    pickle_path: Path
    json_path: Path
    entries: int
    seconds: float


def _env_int(name: str) -> int | None:
    value = os.environ.get(name, "")
    return int(value) if value.strip().lstrip("-").isdigit() else None


class FlightRecorderTrigger:
    """Writes this rank's flight-recorder dump on SIGUSR1, on a trigger file's change, or on an
    exception.
    """

    def __init__(
        self,
        dump_dir: str | os.PathLike[str],
        *,
        rank: int | None = None,
        world_size: int | None = None,
        node: str | None = None,
        signum: int | None = signal.SIGUSR1,
        trigger_file: str | os.PathLike[str] | None = None,
        poll_interval_s: float = 0.2,
        exit_dump_dir: str | os.PathLike[str] | None = None,
        dump_on_sigterm: bool = False,
        include_stack_traces: bool = True,
        include_own_stacks: bool = True,
        only_active: bool = False,
        dump_api: DumpApi | None = None,
        group_tables: GroupTables | None = None,
    ) -> None:
        self.dump_dir = Path(dump_dir)
        self.exit_dump_dir = Path(exit_dump_dir) if exit_dump_dir else self.dump_dir
        self._rank = rank
        self._world_size = world_size
        self.node = node or environment.NODE.get() or socket.gethostname()
        self.signum = signum
        self.dump_on_sigterm = dump_on_sigterm
        self.trigger_file = Path(trigger_file) if trigger_file else None
        self.poll_interval_s = poll_interval_s
        self.include_stack_traces = include_stack_traces
        self.include_own_stacks = include_own_stacks
        self.only_active = only_active
        self._dump_api = dump_api or torch_dump_api
        self._group_tables = group_tables or torch_group_tables
        self.stats = TriggerStats()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._installed = False

    @classmethod
    def from_env(cls, **overrides: Any) -> FlightRecorderTrigger | None:
        """A trigger configured from FAULTLENS_FR_DIR (required), FAULTLENS_FR_TRIGGER,
        FAULTLENS_FR_EXIT_DIR, FAULTLENS_FR_DUMP_ON_SIGTERM (1: dump on SIGTERM) and
        FAULTLENS_FR_STACK_TRACES (0 turns Python stack traces off: the first dump with them imports
        torch._dynamo, about 1 s of CPU, unless the job already did); None when FAULTLENS_FR_DIR is
        not set."""
        dump_dir = overrides.pop("dump_dir", None) or environment.FR_DIR.get()
        if not dump_dir:
            return None
        overrides.setdefault("trigger_file", environment.FR_TRIGGER.get())
        overrides.setdefault("exit_dump_dir", environment.FR_EXIT_DIR.get())
        for variable, option in ((environment.FR_STACK_TRACES, "include_stack_traces"),
                                 (environment.FR_DUMP_ON_SIGTERM, "dump_on_sigterm")):
            value = variable.get_bool()
            if value is not None:
                overrides.setdefault(option, value)
        return cls(dump_dir, **overrides)

    # -- identity
    # -------------------------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        if self._rank is not None:
            return self._rank
        rank = self._dist_value("get_rank")
        return rank if rank is not None else (_env_int("RANK") or 0)

    @property
    def world_size(self) -> int | None:
        if self._world_size is not None:
            return self._world_size
        size = self._dist_value("get_world_size")
        return size if size is not None else _env_int("WORLD_SIZE")

    @staticmethod
    def _dist_value(name: str) -> int | None:
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                return int(getattr(dist, name)())
        except Exception:  # identity is best effort; the env is the fallback
            return None
        return None

    # -- installation
    # ---------------------------------------------------------------------------------------
    def install(self) -> FlightRecorderTrigger:
        """Block the trigger signal in this (main) thread and start the sigwait and trigger-file
        threads. Call it first thing in the process, before `init_process_group` and before starting
        threads, so every thread inherits the blocked mask (a thread that does not block SIGUSR1 can
        receive it, and its default action ends the process; the step timer's writer thread blocks
        it itself)."""
        if self._installed:
            return self
        self._installed = True
        try:
            watched = self._watched_signals()
            if watched:
                if threading.current_thread() is not threading.main_thread():
                    log.warning("fr_trigger: install() outside the main thread; the signal mask "
                                "covers only "
                                "threads started from this one")
                signal.pthread_sigmask(signal.SIG_BLOCK, watched)
                self._start_thread(self._sigwait_loop, "faultlens-fr-sigwait")
            if self.trigger_file is not None:
                self._start_thread(self._poll_loop, "faultlens-fr-trigger-file")
        except Exception as exc:
            self._failed("install", exc)
        return self

    def _start_thread(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _watched_signals(self) -> set[int]:
        watched = {self.signum} if self.signum is not None else set()
        if self.dump_on_sigterm:
            watched.add(signal.SIGTERM)
        return watched

    def _sigwait_loop(self) -> None:
        watched = self._watched_signals()
        while not self._stop.is_set():
            try:
                received = signal.sigwait(watched)
            except Exception as exc:
                self._failed("sigwait", exc)
                return
            if received == signal.SIGTERM and self.dump_on_sigterm:
                self.dump("signal SIGTERM", self.exit_dump_dir)
                _die_of(signal.SIGTERM)
                return
            if self._stop.is_set():
                return
            self.dump(f"signal {signal.Signals(received).name}")

    def _trigger_mtime(self) -> int | None:
        try:
            return os.stat(self.trigger_file).st_mtime_ns  # type: ignore[arg-type]
        except OSError:
            return None

    def _poll_loop(self) -> None:
        seen = self._trigger_mtime()
        while not self._stop.wait(self.poll_interval_s):
            current = self._trigger_mtime()
            if current is not None and current != seen:
                seen = current
                self.dump(f"trigger file {self.trigger_file}")

    def close(self) -> None:
        """Stop the polling thread (the sigwait thread is a daemon and ends with the process)."""
        self._stop.set()

    # -- dumping
    # --------------------------------------------------------------------------------------------
    def dump(
        self, reason: str = "requested", directory: str | os.PathLike[str] | None = None
    ) -> DumpResult | None:
        """Write this rank's dump now. Returns what was written, or None after logging a failure."""
        with self._lock:
            started = time.perf_counter()
            try:
                result = self._write_dump(
                    reason, Path(directory) if directory else self.dump_dir, started
                )
            except Exception as exc:
                self._failed(f"dump ({reason})", exc)
                return None
            self.stats.dumps += 1
            self.stats.last_dump_s = result.seconds
            self.stats.reasons.append(reason)
            log.info(
                "fr_trigger: rank %s wrote %s (%d entries, %.3fs, %s)",
                self.rank,
                result.pickle_path,
                result.entries,
                result.seconds,
                reason,
            )
            return result

    def _write_dump(self, reason: str, directory: Path, started: float) -> DumpResult:
        raw_pickle, raw_json = self._dump_api(self.include_stack_traces, self.only_active)
        try:
            tables = self._group_tables()
        except Exception as exc:  # dump without the repair rather than not at all
            self._failed("group tables", exc)
            tables = {}
        rank, world_size = self.rank, self.world_size
        extra = {"rank": rank, "world_size": world_size, "node": self.node, "pid": os.getpid()}

        trace = safe_loads(raw_pickle, source="torch._dump_fr_trace")
        if not isinstance(trace, dict):
            raise TypeError(f"flight-recorder dump is a {type(trace).__name__}, expected a dict")
        trace["pg_config"] = repair_pg_config(trace.get("pg_config") or {}, tables)
        trace.update(extra)
        as_json = json.loads(raw_json)
        if not isinstance(as_json, dict):
            raise TypeError(f"flight-recorder JSON dump is a {type(as_json).__name__}, expected an "
                            "object")
        as_json["pg_config"] = repair_pg_config(as_json.get("pg_config") or {}, tables)
        as_json.update(extra)

        directory.mkdir(parents=True, exist_ok=True)
        pickle_path = directory / f"rank_{rank}.pkl"
        json_path = directory / f"rank_{rank}.json"
        _atomic_write(pickle_path, pickle.dumps(trace, protocol=2))
        _atomic_write(json_path, json.dumps(as_json).encode())
        if self.include_own_stacks:
            self._write_own_stacks(directory, rank)
        entries = len(trace.get("entries") or ())
        return DumpResult(reason, pickle_path, json_path, entries, time.perf_counter() - started)

    def _write_own_stacks(self, directory: Path, rank: int) -> None:
        """This process's other threads' Python stacks beside the dump; a failure is counted, the
        dump stands.
        """
        try:
            stacks = own_stacks({t.ident for t in self._threads if t.ident is not None})
            target = directory / OWN_STACKS_DIR
            target.mkdir(parents=True, exist_ok=True)
            _atomic_write(target / f"rank_{rank}.json", json.dumps(stacks).encode())
        except Exception as exc:
            self._failed("own stacks", exc)

    @contextlib.contextmanager
    def dump_on_exception(self) -> Iterator[FlightRecorderTrigger]:
        """On the way out of any exception (SystemExit(0) aside) write a dump into exit_dump_dir,
        then re-raise.
        """
        try:
            yield self
        except BaseException as exc:
            if not (isinstance(exc, SystemExit) and exc.code in (0, None)):
                self.dump(f"exception {type(exc).__name__}", self.exit_dump_dir)
            raise

    def _failed(self, what: str, exc: BaseException) -> None:
        self.stats.failures += 1
        self.stats.last_error = f"{what}: {type(exc).__name__}: {exc}"
        log.warning("fr_trigger: %s", self.stats.last_error)


def _die_of(signum: int) -> None:
    """End the process by `signum` with its default action, as if it had not been intercepted:
    unblock it in this thread only (every other thread still blocks it, so this one receives it) and
    send it to the process."""
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
        os.kill(os.getpid(), signum)
        # a Python-level handler may be installed: give the main thread time to act on it
        time.sleep(5.0)
    finally:
        os._exit(128 + signum)


def _atomic_write(path: Path, data: bytes) -> None:
    atomic_write(path, data, make_dirs=False)
