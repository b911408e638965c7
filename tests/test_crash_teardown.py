"""An error stamped to the whole second is in the supervisor's teardown when its second is the
teardown's second.

torch's error files (source error_json) and torchrun's failure report carry whole seconds: an echo
written 0.2 s after the supervisor's SIGTERM reads .000, before it. Compared as if .000 were exact,
the real demo run below had a batch pass call such an echo a crash with no primary (0.2, escalated)
where the live pass had decided a hang and torn the attempt down. Rows come from the producers' own
code (torch's real error files through the process source's reader, the supervisor's signal_sent
rows) and go through a real store."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from faultlens.attribution.engine import Engine, attribute
from faultlens.attribution.incident import IncidentClass
from faultlens.attribution.reading.store import Store
from faultlens.attribution.reading.telemetry import load_from_store
from faultlens.collectors.sources.process_events import (
    EventContext,
    Source,
    rows_from_error_file,
    signal_sent_row,
)
from faultlens.collectors.sources.xid_catalog import load_xid_catalog
from tests.engine_rows import at, event, ranks_rows, write

DEMO_SIGKILL = Path(__file__).parent / "data" / "teardown" / "demo-sigkill"
# where in the row's own second the supervisor's first SIGTERM went out
SAME_SECOND = (0.0, 0.116, 0.5, 0.999)


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine(catalog=load_xid_catalog())


def crashes(store: Path, engine: Engine) -> list:
    return [
        i for i in attribute(str(store), engine=engine) if i.incident_class == IncidentClass.CRASH
    ]


def teardown(ts: dt.datetime, *, job: str = "job-1", node: str = "node-00") -> dict:
    return signal_sent_row(
        EventContext(node=node, job_id=job, attempt=0),
        ts,
        pid=4242,
        signal="SIGTERM",
        message="teardown after incident inc-x (collective_hang/unknown): decision failover",
    )


def test_the_demo_runs_echo_in_the_teardowns_second_is_no_crash(engine: Engine) -> None:
    """The real `faultlens demo` run of tests/data/teardown/demo-sigkill, attempt 1: the live engine
    decided a hang and the supervisor sent SIGTERM at 17:35:54.0098; rank 2's error file of the echo
    ("Connection closed by peer", the same line its stderr shows at .075) is stamped 17:35:54."""
    with Store(str(DEMO_SIGKILL)) as store:
        events = load_from_store(store).process_events
    attempt = events[events["attempt"] == 1]
    start = attempt.loc[attempt["kind"] == "signal_sent", "ts"].min()
    echo = attempt[attempt["source"] == Source.ERROR_JSON]
    # the fixture holds the case: a whole second, the teardown's, before it as an exact time
    (stamp,) = echo["ts"]
    assert stamp == start.floor("s") and stamp < start
    assert echo["message"].str.contains("Connection closed by peer").all()

    found = {i.attempt: i for i in crashes(DEMO_SIGKILL, engine)}

    assert 1 not in found, found[1]
    # its SIGKILL stays named
    assert (found[2].rule, found[2].culprit_ranks) == ("crash-killed-by-signal", (2,))


def _error_file_rows(torch_artifacts: dict[str, Path], what: str) -> list[dict]:
    """The rows of a real torchrun crash's error file (crash_exception, attempt 0: rank 2 raised
    ValueError; or the first survivor's echo, whatever torch wrote there: "Connection closed by
    peer", or on a loaded machine a gloo timeout), as the process source reads it."""
    context = EventContext(node="node-00", job_id="job-1", attempt=0)
    for path in sorted(torch_artifacts["crash_exception"].glob("logdir/*/attempt_0/*/error.json")):
        rank = int(path.parent.name)
        rows = rows_from_error_file(path, context, rank=rank, local_rank=rank)
        assert [r["source"] for r in rows] == [Source.ERROR_JSON]
        own = rank == 2 and rows[0]["kind"] == "exception"
        echo = rank != 2
        if own if what == "exception" else echo:
            return rows
    raise AssertionError(f"crash_exception has no error file of the {what}")


def _stamp(rows: list[dict]) -> dt.datetime:
    (row,) = rows
    ts = dt.datetime.fromtimestamp(row["ts"] / 1e9, dt.UTC)
    assert ts.microsecond == 0  # torch wrote whole seconds
    return ts


@pytest.mark.parametrize("offset", SAME_SECOND)
@pytest.mark.parametrize("what", ["exception", "echo"])
def test_a_real_error_file_in_the_teardowns_second_is_a_termination(
    torch_artifacts: dict[str, Path], store_dir: Path, engine: Engine, what: str, offset: float
) -> None:
    rows = _error_file_rows(torch_artifacts, what)
    write(store_dir, "ranks", ranks_rows("job-1", 0, 4, 4))
    write(
        store_dir, "process_events", [*rows, teardown(_stamp(rows) + dt.timedelta(seconds=offset))]
    )

    assert crashes(store_dir, engine) == []


def test_a_real_error_file_of_the_second_before_the_teardown_stays_a_failure(
        torch_artifacts: dict[str, Path], store_dir: Path, engine: Engine) -> None:
    """The same rows with the SIGTERM 0.116 s into the next second: the error came before the
    teardown, and rank 2's own exception is the primary."""
    rows = _error_file_rows(torch_artifacts, "exception")
    write(store_dir, "ranks", ranks_rows("job-1", 0, 4, 4))
    write(
        store_dir, "process_events", [*rows, teardown(_stamp(rows) + dt.timedelta(seconds=1.116))]
    )

    (incident,) = crashes(store_dir, engine)

    assert (incident.rule, incident.culprit_ranks) == ("crash-exception", (2,))


#: the survivors' error files of a CI run (rank 0 "Connection closed by peer", ranks 1 and 3 gloo
#: timeouts; README)
STORED_ERROR_FILES = Path(__file__).parent / "data" / "teardown" / "crash-exception-error-files"


def _survivor_echoes(root: Path, pattern: str, stored: bool) -> list[list[dict]]:
    """The rows of every survivor's error file (ranks other than 2): root.glob(pattern),
    <rank>/error.json. The stored run has all three; in a generated one, a survivor that torchrun's
    teardown SIGTERMed before it raised writes none (a CI run of 7d4633b: rank 0's was missing), so
    there at least one."""
    context = EventContext(node="node-00", job_id="job-1", attempt=0)
    found = [
        rows_from_error_file(
            path, context, rank=int(path.parent.name), local_rank=int(path.parent.name)
        )
        for path in sorted(root.glob(pattern))
        if path.parent.name != "2"
    ]
    assert (len(found) == 3) if stored else (1 <= len(found) <= 3), root
    return found


@pytest.mark.parametrize("where", ["generated", "stored"])
def test_a_survivors_echo_of_the_second_before_the_teardown_names_nobody(
        torch_artifacts: dict[str, Path], tmp_path: Path, engine: Engine, where: str) -> None:
    """A survivor's echo alone, before the teardown, names no culprit, whichever secondary error
    torch wrote ("Connection closed by peer" is a crash with no primary, as in the demo's batch
    verdict; a gloo timeout is left to the hang analysis): every survivor's file of this session's
    run and of the CI run kept in tests/data."""
    echoes = (
        _survivor_echoes(STORED_ERROR_FILES, "*/error.json", stored=True)
        if where == "stored"
        else _survivor_echoes(
            torch_artifacts["crash_exception"] / "logdir", "*/attempt_0/*/error.json", stored=False
        )
    )
    for i, rows in enumerate(echoes):
        store_dir = tmp_path / f"store-{i}"
        write(store_dir, "ranks", ranks_rows("job-1", 0, 4, 4))
        write(
            store_dir,
            "process_events",
            [*rows, teardown(_stamp(rows) + dt.timedelta(seconds=1.116))],
        )

        found = crashes(store_dir, engine)

        assert len(found) <= 1 and all(i.culprit_ranks == () for i in found), (
            rows[0]["message"],
            found,
        )
        assert all(i.rule == "crash-no-primary" for i in found), found


BUG = {
    "exception_type": "ValueError",
    "message": "ValueError: shapes do not match",
    "fingerprint": "fp-shapes",
}


@pytest.mark.parametrize(("source", "seconds", "in_teardown"), [
    (Source.TORCHRUN_REPORT, 100.0, True),  # torchrun's report: whole seconds too
    (Source.ERROR_JSON, 99.0, False),  # the second before
    (Source.STDERR, 100.0, False),  # a teed line's own time is exact: .000 is .000
    # an error file without a timestamp: its mtime, at full resolution
    (Source.ERROR_JSON, 100.05, False),
])
def test_each_row_is_compared_at_its_own_resolution(
    store_dir: Path, engine: Engine, source: str, seconds: float, in_teardown: bool
) -> None:
    write(store_dir, "ranks", ranks_rows("job-1", 0, 4, 4))
    write(store_dir, "process_events", [event("exception", 2, seconds, source=source, **BUG),
                                        teardown(at(100.116))])

    found = crashes(store_dir, engine)

    if in_teardown:
        assert found == []
    else:
        (incident,) = found
        assert (incident.rule, incident.culprit_ranks) == ("crash-exception", (2,))


CLOSED = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by "
          "peer "
          "[127.0.0.1]:15242. This is typically caused by a remote worker crashing.")


@pytest.mark.parametrize(("sigterm_at", "stopped_from_outside"), [(100.3, False), (101.3, True)])
def test_a_stop_reported_in_the_teardowns_second_is_the_supervisors(
    store_dir: Path, engine: Engine, sigterm_at: float, stopped_from_outside: bool
) -> None:
    """torchrun's report names rank 1's SIGTERM its node's root cause, stamped 100 s (whole
    seconds); the other node's ranks lost contact. With the supervisor's SIGTERM 0.3 s into that
    second, the stop may be its own: no node is blamed for it. A second later, the stop came first:
    something on node-00 stopped the rank."""
    write(store_dir, "ranks", ranks_rows("job-1", 0, 4, 2))
    write(
        store_dir,
        "process_events",
        [
            event(
                "exit",
                1,
                100.0,
                source=Source.TORCHRUN_REPORT,
                exit_code=-15,
                signal="SIGTERM",
                per_node=2,
                reported_root_cause=True,
            ),
            *(
                event(
                    "comm_error",
                    r,
                    99.5,
                    source=Source.STDERR,
                    message=CLOSED,
                    is_secondary=True,
                    per_node=2,
                )
                for r in (2, 3)
            ),
            teardown(at(sigterm_at)),
        ],
    )

    killed = [i for i in crashes(store_dir, engine) if i.rule == "crash-killed-by-signal"]

    assert [(i.culprit_nodes, i.culprit_ranks) for i in killed] == (
        [(("node-00",), (1,))] if stopped_from_outside else []
    )
