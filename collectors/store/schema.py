"""Arrow schemas of every faultlens table: the contract between collectors, the store and
attribution.

Every table starts with the identity columns (docs/design.md, "Tables"); a column that does not
apply to a row is null. SCHEMA_VERSION is written into the key-value metadata of every Parquet
segment. Columns may be added in later versions (readers union by name); a column is never renamed
or retyped without a version bump.

Timestamps are UTC microseconds (Parquet INT64 TIMESTAMP(MICROS, isAdjustedToUTC=true)), the type
Spark, Trino, BigQuery and Athena read natively. Version 1 stored them as nanoseconds; such segments
stay readable (every reader conforms them to these schemas, truncating below the microsecond).
Producers keep one convention: an integer given for a timestamp column is nanoseconds since the
epoch (time.time_ns()); rows_to_table and validate turn it, and any timestamp of another unit, into
microseconds.

Each table is declared once (TABLE_SPECS): its columns, its Scope (whose rows it holds) and its
Roles (what the follower, the batch pass, the supervisor, the lab do with it). The tuples of tables
they iterate derive from the declarations (tables_with), so a new table is one declaration.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from enum import Enum
from types import MappingProxyType
from typing import Any

import pyarrow as pa

from faultlens.errors import FaultlensError

SCHEMA_VERSION = "2"  # 2: timestamps in microseconds (1: nanoseconds)
METADATA_VERSION_KEY = b"faultlens.schema_version"
METADATA_TABLE_KEY = b"faultlens.table"

TS = pa.timestamp("us", tz="UTC")
# schema version 1, and what an integer given for a timestamp means
TS_NS = pa.timestamp("ns", tz="UTC")
INT_LIST = pa.list_(pa.int64())
STR_LIST = pa.list_(pa.string())


class SchemaError(ValueError, FaultlensError):
    """A batch does not fit its table: the message names the table, the column and what was
    expected.
    """


def _f(name: str, typ: pa.DataType, nullable: bool = True) -> pa.Field:
    return pa.field(name, typ, nullable=nullable)


IDENTITY_FIELDS: tuple[pa.Field, ...] = (
    _f("ts", TS, nullable=False),
    _f("cluster", pa.string()),
    _f("node", pa.string()),
    _f("job_id", pa.string()),
    _f("attempt", pa.int32()),
    _f("rank", pa.int32()),
    _f("local_rank", pa.int32()),
    _f("gpu_index", pa.int32()),
    _f("gpu_uuid", pa.string()),
    _f("pci_bus_id", pa.string()),
)

EVIDENCE_TYPE = pa.list_(
    pa.struct([_f("table", pa.string()), _f("ts", TS), _f("text", pa.string())])
)


class Scope(Enum):
    """Whose rows a table holds, which says how a reader narrows it (docs/design.md "Layout")."""

    UNKNOWN = "unknown"
    #: telemetry of one job's processes, written under job=<its id>: Store.scope_to_job narrows
    #: these views
    JOB = "job"
    #: telemetry of a node's GPUs: read by node and time, whatever job a row names (job=_node
    #: when none)
    NODE = "node"
    #: what faultlens writes about jobs (incidents, decisions, the checkpoint catalog): read
    #: across jobs, never narrowed to one job's partitions
    RECORD = "record"


class Role(Enum):
    """What a reader or writer does with a table beyond storing it: one derived tuple per role."""

    UNKNOWN = "unknown"
    #: a job's tables the batch pass reads whole (attribution/reading/windows.py SMALL_TABLES):
    #: they grow with nodes and attempts, not with time
    READ_WHOLE = "read_whole"
    #: tables whose attempts tell which windows a job has (windows.py ATTEMPT_TABLES)
    PER_ATTEMPT = "per_attempt"
    #: the live window's tables, tailed by the follower (attribution/follow.py TAILED_TABLES)
    TAILED = "tailed"
    #: rows a decision waits on: the supervisor writes them through and they wake its watch
    #: loop (controller/supervisor/watch.py URGENT_TABLES)
    URGENT = "urgent"
    #: the views Store.scope_to_job narrows to one job's partitions (attribution/reading/
    #: store.py JOB_TABLES): exactly the tables of Scope.JOB (check_specs)
    JOB_VIEW = "job_view"
    #: the telemetry the lab's live replay copies into its scratch store (controller/lab/
    #: replay.py REPLAY_TABLES)
    REPLAYED = "replayed"
    #: the tables the simulator collects as rows and writes at the end (controller/lab/
    #: simulate/run.py ROW_TABLES; GPU samples and steps it writes as it makes them)
    SIMULATED_ROWS = "simulated_rows"


@dataclass(frozen=True)
class TableSpec:
    """One table: its name, its scope, its roles and its own columns (after the identity ones).

    `roles` maps each role of the table to its place among that role's tables: a derived tuple
    keeps the order its reader has always used (the follower polls its tables in that order and
    tests count its listings), and no one order of all the tables fits every role."""

    name: str
    scope: Scope
    roles: Mapping[Role, int] = dataclass_field(hash=False)
    fields: tuple[pa.Field, ...]

    def __post_init__(self) -> None:
        # frozen all the way down: a role's tuple cannot change after import
        object.__setattr__(self, "roles", MappingProxyType(dict(self.roles)))


TABLE_SPECS: tuple[TableSpec, ...] = (
    # one rank's placement for one attempt (ts = process start)
    TableSpec("ranks", Scope.JOB, {Role.READ_WHOLE: 0, Role.PER_ATTEMPT: 0, Role.TAILED: 0,
                                   Role.JOB_VIEW: 1, Role.REPLAYED: 0, Role.SIMULATED_ROWS: 0}, (
        _f("pid", pa.int64()),
        _f("world_size", pa.int32()),
        _f("local_world_size", pa.int32()),
        _f("hostname", pa.string()),
        # parallel coordinates, when the training code declares them
        _f("dp_rank", pa.int32()),
        _f("pp_rank", pa.int32()),
        _f("tp_rank", pa.int32()),
        _f("cp_rank", pa.int32()),
        _f("ep_rank", pa.int32()),
        _f("pp_size", pa.int32()),
        # the steps the job declares it will run (StepTimer(total_steps=), FAULTLENS_TOTAL_STEPS,
        # `faultlens run --total-steps`): with the recent step time, the job's remaining time
        _f("total_steps", pa.int64()),
    )),
    # one periodic NVML (or dcgm-exporter) sample of one GPU
    TableSpec("gpu_samples", Scope.NODE, {Role.TAILED: 4, Role.REPLAYED: 4}, (
        _f("source", pa.string()),
        _f("gpu_name", pa.string()),
        _f("temp_c", pa.float32()),
        _f("hbm_temp_c", pa.float32()),
        _f("power_w", pa.float32()),
        _f("energy_mj", pa.int64()),
        _f("sm_clock_mhz", pa.int32()),
        _f("mem_clock_mhz", pa.int32()),
        _f("gpu_util_pct", pa.float32()),
        _f("mem_util_pct", pa.float32()),
        _f("mem_used_bytes", pa.int64()),
        _f("mem_total_bytes", pa.int64()),
        _f("clocks_event_reasons", pa.int64()),
        _f("ecc_sbe_volatile", pa.int64()),
        _f("ecc_dbe_volatile", pa.int64()),
        _f("ecc_sbe_aggregate", pa.int64()),
        _f("ecc_dbe_aggregate", pa.int64()),
        _f("ecc_dram_corrected", pa.int64()),
        _f("ecc_dram_uncorrected", pa.int64()),
        _f("ecc_sram_corrected", pa.int64()),
        _f("ecc_sram_uncorrected", pa.int64()),
        _f("retired_pages_sbe", pa.int64()),
        _f("retired_pages_dbe", pa.int64()),
        _f("retired_pages_pending", pa.bool_()),
        _f("remapped_rows_correctable", pa.int64()),
        _f("remapped_rows_uncorrectable", pa.int64()),
        _f("remap_pending", pa.bool_()),
        _f("remap_failure", pa.bool_()),
        _f("recovery_action", pa.int32()),
        _f("pcie_replay_count", pa.int64()),
        _f("nvlink_replay_errors", pa.int64()),
        _f("nvlink_recovery_errors", pa.int64()),
        _f("nvlink_crc_errors", pa.int64()),
    )),
    # one discrete GPU health event
    TableSpec("gpu_events", Scope.NODE, {Role.TAILED: 3, Role.URGENT: 1, Role.REPLAYED: 3,
                                         Role.SIMULATED_ROWS: 2}, (
        _f("source", pa.string()),  # nvml_event, kmsg, dcgm, sample_delta, recorded
        # xid, sxid, ecc_dbe, remap_pending, remap_failure, gpu_lost, thermal, ...
        _f("kind", pa.string()),
        _f("code", pa.int32()),  # XID number where kind is xid/sxid
        _f("message", pa.string()),
        _f("pid", pa.int64()),
        _f("process_name", pa.string()),
        _f("raw", pa.string()),  # the original line or record, when there is one
    )),
    # one training step of one rank
    TableSpec("steps", Scope.JOB, {Role.PER_ATTEMPT: 1, Role.TAILED: 1, Role.JOB_VIEW: 0,
                                   Role.REPLAYED: 1}, (
        _f("step", pa.int64()),
        _f("phase", pa.string()),  # train, eval, warmup, checkpoint
        _f("start_ts", TS),
        _f("end_ts", TS),
        _f("duration_s", pa.float64()),
        # section name -> seconds (user-defined allowed)
        _f("sections", pa.map_(pa.string(), pa.float64())),
        _f("tokens", pa.int64()),
        _f("samples", pa.int64()),
        _f("loss", pa.float64()),
    )),
    # one flight-recorder entry of one rank
    TableSpec("collectives", Scope.JOB, {Role.PER_ATTEMPT: 4, Role.TAILED: 5, Role.JOB_VIEW: 4,
                                         Role.REPLAYED: 5, Role.SIMULATED_ROWS: 3}, (
        _f("dump_id", pa.string()),
        _f("fr_version", pa.string()),
        _f("comm_lib", pa.string()),
        _f("pg_id", pa.string()),
        _f("pg_name", pa.string()),
        _f("pg_desc", pa.string()),
        _f("pg_ranks", pa.list_(pa.int32())),
        _f("pg_last_enqueued", pa.int64()),
        _f("pg_last_started", pa.int64()),
        _f("pg_last_completed", pa.int64()),
        _f("record_id", pa.int64()),
        _f("collective_seq_id", pa.int64()),
        _f("p2p_seq_id", pa.int64()),
        _f("op_id", pa.int64()),
        _f("op", pa.string()),  # profiling_name, e.g. nccl:all_reduce
        _f("state", pa.string()),  # scheduled, started, completed
        _f("is_p2p", pa.bool_()),
        _f("retired", pa.bool_()),
        _f("time_created", TS),
        _f("time_started", TS),
        _f("time_completed", TS),
        _f("input_sizes", pa.list_(INT_LIST)),
        _f("input_dtypes", STR_LIST),
        _f("output_sizes", pa.list_(INT_LIST)),
        _f("output_dtypes", STR_LIST),
        _f("timeout_ms", pa.int64()),
        _f("frames", STR_LIST),  # top frames, "name (file:line)"
    )),
    # one thing that happened to a rank process
    TableSpec("process_events", Scope.JOB, {Role.READ_WHOLE: 1, Role.PER_ATTEMPT: 2, Role.TAILED: 2,
                                            Role.URGENT: 0, Role.JOB_VIEW: 2, Role.REPLAYED: 2,
                                            Role.SIMULATED_ROWS: 1}, (
        # start, exit, signal, exception, watchdog_timeout, comm_error, oom; agent_exit,
        _f("kind", pa.string()),
        # signal_sent (written by a supervisor: collectors/sources/process_events/rows.py
        # SupervisorKind)
        _f("source", pa.string()),  # torchrun_log, error_json, stderr, supervisor
        _f("pid", pa.int64()),
        _f("exit_code", pa.int32()),
        _f("signal", pa.string()),  # SIGKILL, SIGTERM, ...
        _f("exception_type", pa.string()),
        _f("message", pa.string()),
        _f("traceback", pa.string()),
        _f("fingerprint", pa.string()),
        _f("is_secondary", pa.bool_()),  # a survivor's echo of someone else's failure
        _f("step", pa.int64()),
        _f("error_file", pa.string()),
        # torchrun named this failure its "Root Cause" (may be a survivor)
        _f("reported_root_cause", pa.bool_()),
    )),
    # one attributed incident
    TableSpec("incidents", Scope.RECORD, {}, (
        _f("incident_id", pa.string()),
        _f("class", pa.string()),  # crash, collective_hang, straggler, health
        # gpu_hardware, hbm, nvlink, pcie, network, thermal, software, ...
        _f("cause", pa.string()),
        _f("culprit_nodes", STR_LIST),
        _f("culprit_ranks", pa.list_(pa.int32())),
        _f("culprit_gpus", STR_LIST),
        _f("first_signal_ts", TS),
        _f("detected_ts", TS),
        _f("confidence", pa.float64()),
        _f("evidence", EVIDENCE_TYPE),
        _f("rule", pa.string()),
        _f("summary", pa.string()),
        _f("fingerprint", pa.string()),
        _f("step", pa.int64()),
    )),
    # one decision for one incident (append-only: a later row with the same decision_id updates
    # delivery)
    TableSpec("decisions", Scope.RECORD, {}, (
        _f("decision_id", pa.string()),
        _f("incident_id", pa.string()),
        _f("action", pa.string()),  # failover, escalate, drain
        _f("class", pa.string()),
        _f("cause", pa.string()),
        _f("exclude_nodes", STR_LIST),
        _f("restore_tier", pa.string()),
        _f("restore_step", pa.int64()),
        _f("restore_uri", pa.string()),
        _f("reason", pa.string()),
        _f("confidence", pa.float64()),
        _f("rule", pa.string()),
        _f("issued_ts", TS),
        _f("delivery_status", pa.string()),  # pending, delivered, applied, failed
        _f("hook", pa.string()),
        _f("document", pa.string()),  # the versioned JSON decision
        _f("delivery_error", pa.string()),  # why the last attempt of this hook failed
        _f("delivery_attempts", pa.int32()),  # attempts made by this hook in this pass
    )),
    # one heartbeat of one rank (collectors/training/heartbeat.py reads the record the step timer
    # keeps; ts = last seen alive)
    TableSpec("heartbeats", Scope.JOB, {Role.PER_ATTEMPT: 3, Role.TAILED: 6, Role.JOB_VIEW: 3}, (
        _f("pid", pa.int64()),
        _f("step", pa.int64()),  # the last completed step (null: none yet)
        _f("step_ts", TS),  # when it ended
        _f("steps", pa.int64()),  # steps completed by this process
        _f("current_step", pa.int64()),  # the step in progress (null: between steps)
        _f("in_step", pa.bool_()),
        # the phase of the step in progress (train, eval, warmup, checkpoint; null: none)
        _f("phase", pa.string()),
        _f("loss", pa.float64()),  # the last step's loss (null when not finite: see bad_loss_step)
        _f("bad_loss_step", pa.int64()),  # the first step whose loss was NaN or Inf
        _f("closed", pa.bool_()),  # the step timer was closed: this rank steps no more
        # the rank's own work so far (heartbeat.py RankUsage): CPU seconds of its process and its
        # DataLoader workers plus time blocked in disk I/O, bytes it read and wrote (null: unknown)
        _f("cpu_s", pa.float64()),
        _f("io_bytes", pa.int64()),
    )),
    # one rank's numerics at one step (collectors/training/numerics.py, opt-in): its own loss and
    # gradient norm before the gradient all_reduce; every N steps a digest of its parameter shard
    TableSpec("numerics", Scope.JOB, {Role.TAILED: 7, Role.JOB_VIEW: 5, Role.REPLAYED: 6}, (
        _f("step", pa.int64()),
        _f("phase", pa.string()),
        _f("loss", pa.float64()),  # this rank's own loss (NaN and Inf kept)
        _f("grad_norm", pa.float64()),  # L2 norm of this rank's local gradients (NaN/Inf kept)
        _f("digest", pa.string()),  # hash of the parameter shard after the optimizer step
        _f("digest_bytes", pa.int64()),  # bytes hashed
        _f("digest_s", pa.float64()),  # seconds the digest took on the training thread
        _f("dp_rank", pa.int32()),
        _f("tp_rank", pa.int32()),
        _f("pp_rank", pa.int32()),
        _f("batch", pa.string()),  # the batch's id when the script gives one (else the step)
    )),
    # one checkpoint seen in a tier
    TableSpec("checkpoints", Scope.RECORD, {Role.SIMULATED_ROWS: 4}, (
        _f("tier", pa.string()),  # local, peer, durable
        _f("step", pa.int64()),
        _f("uri", pa.string()),
        _f("layout", pa.string()),  # dcp, shards
        _f("world_size", pa.int32()),
        _f("complete", pa.bool_()),
        _f("bytes", pa.int64()),
        _f("checksum_status", pa.string()),  # verified, mismatch, unverified, unknown
    )),
    # one health check of a node (`faultlens node-check`; controller/slurm/nodecheck.py):
    # node = the node, ts = when it ran
    TableSpec("node_checks", Scope.RECORD, {}, (
        _f("verdict", pa.string()),  # pass, fail, repeat_offender
        _f("action", pa.string()),  # resumed, drained, kept_drained, none
        _f("since_ts", TS),  # events counted from here (the drain, else the last check)
        _f("events", pa.int32()),  # failing GPU events since then
        _f("event_kinds", pa.string()),  # e.g. "xid 79, gpu_lost"
        _f("returned_ts", TS),  # the node's last return to service before this check
        _f("reason", pa.string()),  # the node reason set in Slurm
    )),
)

TABLES: dict[str, pa.Schema] = {
    spec.name: pa.schema(
        list(IDENTITY_FIELDS) + list(spec.fields),
        metadata={METADATA_VERSION_KEY: SCHEMA_VERSION.encode(),
                  METADATA_TABLE_KEY: spec.name.encode()},
    )
    for spec in TABLE_SPECS
}
TABLE_NAMES: tuple[str, ...] = tuple(TABLES)
SPECS: dict[str, TableSpec] = {spec.name: spec for spec in TABLE_SPECS}


def tables_with(role: Role) -> tuple[str, ...]:
    """The names of the tables that have `role`, in the order of the places their declarations
    give it (TableSpec.roles)."""
    return tuple(spec.name for spec in sorted((s for s in TABLE_SPECS if role in s.roles),
                                              key=lambda s: s.roles[role]))


def check_specs(specs: Sequence[TableSpec]) -> None:
    """A declaration that contradicts itself fails at import, not in the reader it would mislead."""
    names = [spec.name for spec in specs]
    if len(set(names)) != len(names):
        raise SchemaError(f"a table is declared twice: {names}")
    for spec in specs:
        if spec.scope is Scope.UNKNOWN or Role.UNKNOWN in spec.roles:
            raise SchemaError(f"table {spec.name!r}: declared with an unknown scope or role")
        if (Role.JOB_VIEW in spec.roles) != (spec.scope is Scope.JOB):
            raise SchemaError(f"table {spec.name!r}: a job view is exactly a table of Scope.JOB")
    for role in Role:
        places = [spec.roles[role] for spec in specs if role in spec.roles]
        if len(set(places)) != len(places):
            raise SchemaError(f"role {role.name}: two tables share a place ({sorted(places)})")


check_specs(TABLE_SPECS)


def ts_array(ns_since_epoch: Any) -> pa.Array:
    """Integers of ns since the epoch (a numpy array or a sequence; None/NaN-free) as a column of
    TS: microseconds, truncated, as validate() does."""
    return pa.array(ns_since_epoch, pa.int64()).cast(TS_NS).cast(TS, safe=False)


def schema_for(table: str) -> pa.Schema:
    """The Arrow schema of `table`, or SchemaError naming the known tables."""
    try:
        return TABLES[table]
    except KeyError:
        raise SchemaError(
            f"unknown table {table!r}: expected one of {', '.join(TABLE_NAMES)}"
        ) from None


def as_ns_type(typ: pa.DataType) -> pa.DataType:
    """`typ` with every timestamp in it (nested in lists, structs and maps too) made nanoseconds,
    time zone kept.
    """
    if pa.types.is_timestamp(typ):
        return pa.timestamp("ns", tz=typ.tz)
    if pa.types.is_list(typ):
        return pa.list_(typ.value_field.with_type(as_ns_type(typ.value_type)))
    if pa.types.is_large_list(typ):
        return pa.large_list(typ.value_field.with_type(as_ns_type(typ.value_type)))
    if pa.types.is_struct(typ):
        return pa.struct(
            [typ.field(i).with_type(as_ns_type(typ.field(i).type)) for i in range(typ.num_fields)]
        )
    if pa.types.is_map(typ):
        return pa.map_(typ.key_field.with_type(as_ns_type(typ.key_type)),
                       typ.item_field.with_type(as_ns_type(typ.item_type)))
    return typ


def _has_timestamp(typ: pa.DataType) -> bool:
    if pa.types.is_timestamp(typ):
        return True
    return any(_has_timestamp(typ.field(i).type) for i in range(typ.num_fields))


def _castable(actual: pa.DataType, expected: pa.DataType) -> bool:
    """Lossless-in-kind conversions we accept from producers (width and unit changes, null columns).
    """
    if pa.types.is_null(actual):
        return True
    # nested (evidence): units may differ
    if _has_timestamp(expected) and not pa.types.is_timestamp(expected):
        return as_ns_type(actual).equals(as_ns_type(expected))
    if pa.types.is_integer(actual) and (
        pa.types.is_integer(expected) or pa.types.is_floating(expected)
    ):
        return True
    if pa.types.is_floating(actual) and pa.types.is_floating(expected):
        return True
    if pa.types.is_timestamp(actual) and pa.types.is_timestamp(expected):
        return actual.tz is not None and expected.tz is not None
    return bool(pa.types.is_large_string(actual) and pa.types.is_string(expected))


def validate(table: str, data: pa.RecordBatch | pa.Table) -> pa.Table:
    """Check `data` against `table`'s schema and return it conformed (column order, types, missing
    nullable columns filled with nulls). Raises SchemaError naming the table, the column and what
    was expected."""
    schema = schema_for(table)
    if isinstance(data, pa.RecordBatch):
        data = pa.Table.from_batches([data])
    if not isinstance(data, pa.Table):
        raise SchemaError(f"table {table!r}: expected a pyarrow Table or RecordBatch, got "
                          f"{type(data).__name__}")
    names = data.column_names  # (a new list per access: once, not per field)
    unknown = [name for name in names if schema.get_field_index(name) < 0]
    if unknown:
        raise SchemaError(f"table {table!r}: column {unknown[0]!r} is not in the schema (version "
                          f"{SCHEMA_VERSION})")
    present = set(names)
    columns = []
    for field in schema:
        if field.name not in present:
            if not field.nullable:
                raise SchemaError(f"table {table!r}: column {field.name!r} is required "
                                  f"({field.type}) but missing")
            columns.append(pa.nulls(data.num_rows, field.type))
            continue
        column = data.column(field.name)
        if not column.type.equals(field.type):
            if not _castable(column.type, field.type):
                raise SchemaError(
                    f"table {table!r}: column {field.name!r}: expected {field.type}, got "
                    f"{column.type}"
                )
            try:
                # timestamps of a finer unit (a version-1 segment, a producer's nanoseconds) are
                # truncated to the schema's microseconds: the one conversion here that may drop
                # digits, and it is meant to
                column = column.cast(field.type, safe=not _has_timestamp(field.type))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise SchemaError(
                    f"table {table!r}: column {field.name!r}: expected {field.type}, cannot "
                    f"convert: {exc}"
                ) from None
        if not field.nullable and column.null_count:
            raise SchemaError(f"table {table!r}: column {field.name!r}: expected no nulls, found "
                              f"{column.null_count}")
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=schema)


def rows_to_table(
    table: str, rows: Sequence[Mapping[str, Any]] | Iterable[Mapping[str, Any]]
) -> pa.Table:
    """Build a conforming table from dict rows (missing keys are nulls). A value of the wrong kind
    raises SchemaError naming the table and the column."""
    schema = schema_for(table)
    rows = list(rows)
    for row in rows:
        for key in row:
            if schema.get_field_index(key) < 0:
                raise SchemaError(f"table {table!r}: column {key!r} is not in the schema (version "
                                  f"{SCHEMA_VERSION})")
    arrays = []
    for field in schema:
        values = [row.get(field.name) for row in rows]
        try:
            # timestamps built as nanoseconds first: an integer a producer gives is time.time_ns()
            arrays.append(pa.array(values, type=as_ns_type(field.type)))
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
            raise SchemaError(f"table {table!r}: column {field.name!r}: expected {field.type}: "
                              f"{exc}") from None
    return validate(table, pa.Table.from_arrays(arrays, names=schema.names))


def empty_table(table: str) -> pa.Table:
    """A zero-row table with `table`'s schema (built from null arrays: Schema.empty_table() and
    pa.array() import pandas, a second of CLI start-up)."""
    schema = schema_for(table)
    return pa.Table.from_arrays([pa.nulls(0, f.type) for f in schema], schema=schema)


NS_PER_DAY = 86_400 * 1_000_000_000
US_PER_DAY = 86_400 * 1_000_000


def partition_keys(table: pa.Table) -> tuple[pa.ChunkedArray, pa.ChunkedArray, pa.ChunkedArray]:
    """The (job, day number since epoch, node) partition values of every row, as in the store layout
    of docs/design.md; `partition_date(day)` turns a day number into the YYYY-MM-DD of the path."""
    import pyarrow.compute as pc  # here, not at import: a third of `faultlens sql`'s start-up

    job = pc.fill_null(table.column("job_id"), "_node")
    ts = table.column("ts")
    if not ts.type.equals(TS):
        ts = ts.cast(TS, safe=False)
    day = pc.divide(ts.cast(pa.int64()), US_PER_DAY)
    node = pc.fill_null(table.column("node"), "_unknown")
    return job, day, node


def partition_date(day: int) -> str:
    import datetime as dt

    return (dt.date(1970, 1, 1) + dt.timedelta(days=int(day))).isoformat()
