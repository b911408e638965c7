"""Each table's scope and roles are declared once (collectors/store/schema.py TABLE_SPECS); the
tuples the follower, the batch pass, the store reader, the supervisor and the lab iterate derive
from them. Their values and order are pinned here as they were written by hand before (the
follower polls in TAILED_TABLES' order, tests/test_follow_listing.py counts its listings)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from faultlens.attribution.follow import TAILED_TABLES
from faultlens.attribution.reading.store import JOB_TABLES
from faultlens.attribution.reading.windows import ATTEMPT_TABLES, SMALL_TABLES
from faultlens.collectors.store.schema import (
    SPECS,
    TABLE_NAMES,
    TABLE_SPECS,
    TABLES,
    Role,
    SchemaError,
    Scope,
    TableSpec,
    check_specs,
    tables_with,
)
from faultlens.controller.lab.replay import REPLAY_TABLES
from faultlens.controller.lab.simulate.run import ROW_TABLES
from faultlens.controller.supervisor.watch import URGENT_TABLES

# the hand-written tuples of before the declarations (values and order)
BEFORE = {
    Role.READ_WHOLE: ("ranks", "process_events"),
    Role.PER_ATTEMPT: ("ranks", "steps", "process_events", "heartbeats", "collectives"),
    Role.TAILED: ("ranks", "steps", "process_events", "gpu_events", "gpu_samples", "collectives",
                  "heartbeats", "numerics"),
    Role.JOB_VIEW: ("steps", "ranks", "process_events", "heartbeats", "collectives", "numerics"),
    Role.URGENT: ("process_events", "gpu_events"),
    Role.REPLAYED: ("ranks", "steps", "process_events", "gpu_events", "gpu_samples", "collectives",
                    "numerics"),
    Role.SIMULATED_ROWS: ("ranks", "process_events", "gpu_events", "collectives", "checkpoints"),
}


def test_every_derived_tuple_is_what_was_written_by_hand():
    assert set(BEFORE) == set(Role) - {Role.UNKNOWN}
    for role, expected in BEFORE.items():
        assert tables_with(role) == expected, role
    in_use = {Role.READ_WHOLE: SMALL_TABLES, Role.PER_ATTEMPT: ATTEMPT_TABLES,
              Role.TAILED: TAILED_TABLES, Role.JOB_VIEW: JOB_TABLES, Role.URGENT: URGENT_TABLES,
              Role.REPLAYED: REPLAY_TABLES, Role.SIMULATED_ROWS: ROW_TABLES}
    assert in_use == BEFORE
    assert tables_with(Role.UNKNOWN) == ()


def test_every_table_has_one_declaration_with_a_known_scope():
    assert [spec.name for spec in TABLE_SPECS] == list(TABLE_NAMES) == list(TABLES)
    # the order Store.refresh, compaction and doctor go through the tables in
    assert TABLE_NAMES == ("ranks", "gpu_samples", "gpu_events", "steps", "collectives",
                           "process_events", "incidents", "decisions", "heartbeats", "numerics",
                           "checkpoints", "node_checks")
    for name in TABLE_NAMES:
        spec = SPECS[name]
        assert spec.scope is not Scope.UNKNOWN and isinstance(spec.scope, Scope), name
        assert Role.UNKNOWN not in spec.roles, name
        own = TABLES[name].names[len(TABLES[name].names) - len(spec.fields):]
        assert own == [f.name for f in spec.fields]
    scopes = {name: SPECS[name].scope for name in TABLE_NAMES}
    assert {n for n, s in scopes.items() if s is Scope.NODE} == {"gpu_samples", "gpu_events"}
    records = {n for n, s in scopes.items() if s is Scope.RECORD}
    assert records == {"incidents", "decisions", "checkpoints", "node_checks"}
    # a job view is exactly a table of the job scope: the store narrows those, and only those
    assert set(JOB_TABLES) == {n for n, s in scopes.items() if s is Scope.JOB}


def test_a_declaration_is_frozen_and_a_contradictory_one_is_refused():
    spec = SPECS["steps"]
    with pytest.raises(TypeError):
        spec.roles[Role.URGENT] = 9  # type: ignore[index]
    field = (pa.field("x", pa.int64()),)
    with pytest.raises(SchemaError, match="unknown scope"):
        check_specs([TableSpec("t", Scope.UNKNOWN, {}, field)])
    with pytest.raises(SchemaError, match="unknown scope or role"):
        check_specs([TableSpec("t", Scope.NODE, {Role.UNKNOWN: 0}, field)])
    with pytest.raises(SchemaError, match="job view"):
        check_specs([TableSpec("t", Scope.JOB, {Role.TAILED: 0}, field)])
    with pytest.raises(SchemaError, match="job view"):
        check_specs([TableSpec("t", Scope.NODE, {Role.JOB_VIEW: 0}, field)])
    with pytest.raises(SchemaError, match="share a place"):
        check_specs([TableSpec("a", Scope.NODE, {Role.TAILED: 0}, field),
                     TableSpec("b", Scope.NODE, {Role.TAILED: 0}, field)])
    with pytest.raises(SchemaError, match="declared twice"):
        check_specs([TableSpec("a", Scope.NODE, {}, field), TableSpec("a", Scope.NODE, {}, field)])
    check_specs(TABLE_SPECS)  # the real declarations pass
