"""The cluster simulator: deterministic by seed, the store holds every expected table (read back
through DuckDB), labels match what was injected, each fault leaves its real evidence and no column
or value names a culprit, benign noise is present."""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from faultlens.attribution.reading.store import Store
from faultlens.collectors.sources.kmsg import KernelLogParser
from faultlens.collectors.store.schema import TABLES
from faultlens.controller.cli.main import main as cli
from faultlens.controller.lab.fault_labels import (
    ExpectedAction,
    LabelClass,
    LabelError,
    read_labels,
    write_labels,
)
from faultlens.controller.lab.simulate import ConfigError, SimConfig, simulate
from faultlens.controller.lab.simulate.cluster import Placement, make_nodes
from faultlens.controller.lab.simulate.collectives import (
    HangSpec,
    build_groups,
    resolve,
    step_program,
)
from faultlens.controller.lab.simulate.faults import FAULTS, STRAGGLERS

# a small, busy cluster that injects every fault kind once, in catalog order (independent of the
# seed)
SEED = 5
ALL_KINDS = tuple(k.kind for k in FAULTS + STRAGGLERS)
SMALL = dict(nodes=4, gpus_per_node=8, hours=10.0, faults_per_day=300.0, stragglers_per_day=0.0,
             benign_per_day=150.0, step_seconds=8.0, checkpoint_every_steps=20, eval_every_steps=40,
             fault_sequence=ALL_KINDS)

GPU_EVENT_KINDS = {
    "xid",
    "sxid",
    "ecc_dbe",
    "ecc_sbe_storm",
    "remap_pending",
    "remap_failure",
    "retired_page_pending",
    "recovery_action",
    "gpu_lost",
    "thermal_slowdown_start",
    "thermal_slowdown_end",
    "power_slowdown_start",
    "power_slowdown_end",
    "nvlink_error",
    "pcie_replay",
}
GPU_EVENT_SOURCES = {"nvml_event", "nvml_sample", "kmsg", "dcgm", "recorded"}
PROCESS_KINDS = {"start", "exit", "exception", "oom", "comm_error", "watchdog_timeout"}
PROCESS_SOURCES = {"supervisor", "torchrun_report", "error_json", "stderr"}
NVML_BUS_ID = re.compile(r"^[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]$")


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("sim")
    store = root / "store"
    result = simulate(SimConfig(seed=SEED, **SMALL), str(store))
    with Store(str(store)) as opened:
        yield result, opened, read_labels(result.labels_path)


def ts(value: dt.datetime) -> str:
    return value.isoformat()


def test_labels_live_outside_the_store(sim) -> None:
    result, _, labels = sim
    assert not Path(result.labels_path).resolve().is_relative_to(Path(result.store).resolve())
    assert len(labels) == len(result.labels)
    kinds = {label.kind for label in labels if label.is_fault}
    assert kinds == set(ALL_KINDS)


def test_store_holds_the_expected_tables(sim) -> None:
    result, store, _ = sim
    counts = {row["table"]: row["n"] for row in store.query(
        "SELECT 'steps' AS table, count(*) AS n FROM steps UNION ALL SELECT 'gpu_samples', "
        "count(*) FROM gpu_samples "
        "UNION ALL SELECT 'gpu_events', count(*) FROM gpu_events UNION ALL SELECT 'ranks', "
        "count(*) FROM ranks "
        "UNION ALL SELECT 'process_events', count(*) FROM process_events "
        "UNION ALL SELECT 'collectives', count(*) FROM collectives "
        "UNION ALL SELECT 'checkpoints', count(*) FROM checkpoints").to_pylist()}
    for table, rows in result.rows.items():
        assert counts[table] == rows, table
    assert counts["steps"] > 10_000 and counts["gpu_samples"] > 10_000
    assert store.query("SELECT count(*) AS n FROM incidents").column("n")[0].as_py() == 0
    assert store.query("SELECT count(*) AS n FROM decisions").column("n")[0].as_py() == 0
    # every attempt placed world_size ranks, with parallel coordinates
    per_attempt = store.query(
        "SELECT attempt, count(*) AS n, count(DISTINCT node) AS nodes, "
        "max(pp_rank) AS pp, "
        "max(dp_rank) AS dp, max(tp_rank) AS tp FROM ranks GROUP BY attempt"
    ).to_pylist()
    assert len(per_attempt) == result.attempts
    for row in per_attempt:
        assert (row["n"], row["nodes"], row["tp"]) == (32, 4, 7)
        assert (row["pp"] + 1) * (row["dp"] + 1) == 4
    phases = set(store.query("SELECT DISTINCT phase FROM steps").column("phase").to_pylist())
    assert phases == {"warmup", "train", "checkpoint", "eval"}
    sections = store.query(
        "SELECT map_keys(sections) AS k FROM steps WHERE phase = 'train' LIMIT 1"
    ).to_pylist()
    assert sections[0]["k"] == ["data", "forward", "backward", "optimizer", "comm"]


def test_rows_follow_the_collector_conventions(sim) -> None:
    _, store, _ = sim
    events = store.query("SELECT source, kind, pci_bus_id, code FROM gpu_events").to_pylist()
    assert {e["kind"] for e in events} <= GPU_EVENT_KINDS
    assert {e["source"] for e in events} <= GPU_EVENT_SOURCES
    assert all(NVML_BUS_ID.match(e["pci_bus_id"]) for e in events)
    assert all(e["code"] is not None for e in events if e["kind"] == "xid")
    procs = store.query("SELECT kind, source, exit_code, signal, is_secondary, fingerprint, "
                        "traceback "
                        "FROM process_events").to_pylist()
    assert {p["kind"] for p in procs} <= PROCESS_KINDS
    assert {p["source"] for p in procs} <= PROCESS_SOURCES
    for p in procs:
        if p["kind"] == "exit":
            assert p["exit_code"] is not None
            assert (p["signal"] is None) == (p["exit_code"] >= 0)
        if p["kind"] in ("exception", "oom"):
            assert p["fingerprint"] and p["traceback"].startswith("Traceback (most recent call "
                                                                  "last):")
    # SIGTERM from torchrun to survivors is always an echo
    assert all(p["is_secondary"] for p in procs if p["signal"] == "SIGTERM")


def test_kernel_log_rows_are_what_the_kmsg_collector_parses(sim) -> None:
    _, store, _ = sim
    rows = store.query("SELECT ts, kind, code, pci_bus_id, pid, process_name, message, raw FROM "
                       "gpu_events "
                       "WHERE source = 'kmsg' AND kind = 'xid'").to_pylist()
    assert rows
    parser = KernelLogParser(tz=dt.UTC)
    for row in rows:
        event = next(e for e in parser.feed(row["raw"]) if e.kind == "xid")
        assert (event.code, event.pci_bus_id, event.pid, event.process_name, event.message) == (
            row["code"], row["pci_bus_id"], row["pid"], row["process_name"], row["message"])
        assert abs(event.ts_ns - int(row["ts"].timestamp() * 1e9)) < 2_000


def test_deterministic_by_seed(tmp_path: Path) -> None:
    config = dict(
        nodes=4, hours=2.0, faults_per_day=100.0, benign_per_day=100.0, stragglers_per_day=24.0
    )

    def run(seed: int, name: str) -> tuple[dict[str, list], str]:
        store = tmp_path / name
        result = simulate(SimConfig(seed=seed, **config), str(store))
        with Store(str(store)) as opened:
            tables = {}
            for table in (
                "steps",
                "gpu_samples",
                "gpu_events",
                "process_events",
                "collectives",
                "ranks",
            ):
                order = ", ".join(
                    c
                    for c in (
                        "ts",
                        "node",
                        "rank",
                        "gpu_index",
                        "kind",
                        "record_id",
                        "source",
                        # message: two rows may share a microsecond
                        "message",
                    )
                    if TABLES[table].get_field_index(c) >= 0
                )
                tables[table] = opened.query(f"SELECT * FROM {table} ORDER BY {order}").to_pylist()
        return tables, Path(result.labels_path).read_text()

    first, first_labels = run(5, "a")
    again, again_labels = run(5, "b")
    other, other_labels = run(6, "c")
    assert first_labels == again_labels
    for table in first:
        assert first[table] == again[table], table
    assert first_labels != other_labels
    assert first["steps"] != other["steps"]


def test_labels_match_the_injected_faults(sim) -> None:
    _, store, labels = sim
    placements = {}
    for row in store.query("SELECT attempt, node, list(rank ORDER BY rank) AS ranks FROM ranks "
                           "GROUP BY attempt, node").to_pylist():
        placements.setdefault(row["attempt"], {})[row["node"]] = row["ranks"]
    attempts = sorted(placements)
    for label in labels:
        assert label.job_id == f"pretrain-{SEED}"
        assert label.effect_end_ts >= label.injected_ts
        if not label.is_fault:
            continue
        placed = placements[label.attempt]
        for node in label.culprit_nodes:
            assert node in placed, (label.fault_id, node)
        for rank in label.culprit_ranks:
            assert any(rank in ranks for ranks in placed.values())
        if (
            label.culprit_nodes
            and label.culprit_ranks
            and label.label_class is not LabelClass.STRAGGLER
        ):
            node_ranks = set(placed[label.culprit_nodes[0]])
            assert set(label.culprit_ranks) <= node_ranks
        if label.expected_action is ExpectedAction.ESCALATE:
            assert not label.culprit_nodes  # software and workload: no node to blame
        ends_attempt = label.label_class in (LabelClass.CRASH, LabelClass.COLLECTIVE_HANG)
        if (
            ends_attempt
            and label.expected_action is ExpectedAction.FAILOVER
            and label.attempt + 1 in placements
        ):
            # the supervisor restarted without the culprit node
            assert label.culprit_nodes[0] not in placements[label.attempt + 1], label.fault_id
    crash_attempts = [
        label.attempt
        for label in labels
        if label.label_class in (LabelClass.CRASH, LabelClass.COLLECTIVE_HANG)
    ]
    assert crash_attempts == sorted(crash_attempts)
    assert len(set(crash_attempts)) == len(crash_attempts)  # one interruption per attempt
    assert len(attempts) == len(crash_attempts) + 1 or len(attempts) == len(crash_attempts)


def _window(label, before_s: float = 0.0, after_s: float = 60.0) -> list[str]:
    low = label.window_start - dt.timedelta(seconds=before_s)
    return [ts(low), ts(label.effect_end_ts + dt.timedelta(seconds=after_s))]


def test_every_fault_leaves_its_evidence(sim) -> None:
    _, store, labels = sim
    checked = set()
    for label in labels:
        if not label.is_fault:
            continue
        window = _window(label)
        kind = label.kind
        if kind.startswith(
            ("gpu_xid", "hbm_dbe", "sram_", "gsp_", "nvlink_", "thermal_runaway", "hbm_remap")
        ):
            xids = (
                store.query(
                    "SELECT code FROM gpu_events WHERE source = 'kmsg' AND kind = 'xid' "
                    "AND node = ? "
                    "AND gpu_uuid = ? AND ts BETWEEN ? AND ?",
                    [label.culprit_nodes[0], label.culprit_gpus[0], *window],
                )
                .column("code")
                .to_pylist()
            )
            assert xids, label.fault_id
            assert not set(xids) & {13, 31, 43}, label.fault_id
            checked.add("xid")
        if label.label_class is LabelClass.COLLECTIVE_HANG:
            dumped = store.query("SELECT DISTINCT rank FROM collectives WHERE attempt = ? AND ts "
                                 "BETWEEN ? AND ?",
                                 [label.attempt, *window]).column("rank").to_pylist()
            assert dumped, label.fault_id
            if kind == "host_down":
                assert not set(dumped) & set(label.culprit_ranks)  # a dead node writes no dump
            if kind == "nccl_stuck_rank":
                # the stuck rank answered the dump request but never enqueued the step its peers
                # stall in
                culprit = label.culprit_ranks[0]
                states = store.query(
                    "SELECT state FROM collectives WHERE attempt = ? AND rank = ? "
                    "AND ts BETWEEN ? AND ?",
                    [label.attempt, culprit, *window],
                ).column("state")
                assert set(states.to_pylist()) == {"completed"}
                stalled = store.query("SELECT count(*) AS n FROM collectives WHERE attempt = ? AND "
                                      "state = 'started' "
                                      "AND list_contains(pg_ranks, ?) AND ts BETWEEN ? AND ?",
                                      [label.attempt, culprit, *window]).column("n")[0].as_py()
                assert stalled > 0
            checked.add("hang")
        if label.category in ("Software Bug", "Dependency") and kind != "software_oom":
            prints = store.query("SELECT fingerprint, count(DISTINCT node) AS nodes FROM "
                                 "process_events "
                                 "WHERE kind = 'exception' AND attempt = ? GROUP BY fingerprint",
                                 [label.attempt]).to_pylist()
            assert len(prints) == 1 and prints[0]["nodes"] >= 2, label.fault_id
            assert prints[0]["fingerprint"] == label.extra["fingerprint"]
            checked.add("software")
        if kind == "straggler_thermal_node":
            hot = store.query("SELECT avg(temp_c) AS t, bit_or(clocks_event_reasons) AS r FROM "
                              "gpu_samples "
                              "WHERE node = ? AND ts BETWEEN ? AND ? AND gpu_util_pct > 50",
                              [label.culprit_nodes[0], ts(label.injected_ts),
                               ts(label.effect_end_ts)]).to_pylist()[0]
            if hot["t"] is not None:
                assert hot["t"] > 75 and hot["r"] & 0x20
                checked.add("thermal")
    assert {"xid", "hang", "software"} <= checked


def test_stragglers_show_in_compute_sections(tmp_path: Path) -> None:
    stragglers = ("straggler_slow_gpu", "straggler_thermal_node", "straggler_stage_imbalance")
    store = tmp_path / "store"
    result = simulate(
        SimConfig(
            seed=2,
            nodes=4,
            hours=8.0,
            faults_per_day=9.0,
            stragglers_per_day=0.0,
            benign_per_day=0.0,
            fault_sequence=stragglers,
        ),
        str(store),
    )
    labels = read_labels(result.labels_path)
    seen = set()
    with Store(str(store)) as opened:
        for label in labels:
            if (label.effect_end_ts - label.injected_ts).total_seconds() < 600:
                continue
            low, high = label.injected_ts + dt.timedelta(minutes=1), label.effect_end_ts
            overlapping = [
                o
                for o in labels
                if o is not label and o.injected_ts < high and o.effect_end_ts > low
            ]
            rows = opened.query(
                "SELECT s.rank, r.node, r.pp_rank, median(s.sections['forward'] + "
                "s.sections['backward']) AS compute "
                "FROM steps s JOIN ranks r ON s.rank = r.rank AND s.attempt = r.attempt WHERE "
                "s.attempt = ? "
                "AND s.phase = 'train' AND s.start_ts BETWEEN ? AND ? GROUP BY ALL",
                [label.attempt, ts(low), ts(high)]).to_pylist()
            if not rows or overlapping:
                continue
            median = float(np.median([r["compute"] for r in rows]))
            if label.kind == "straggler_stage_imbalance":
                slow = [r for r in rows if r["pp_rank"] == label.extra["stage"]]
            else:
                slow = [r for r in rows if r["node"] == label.culprit_nodes[0]]
            fast = [r for r in rows if r not in slow]
            fast_median = float(np.median([r["compute"] for r in fast]))
            assert min(r["compute"] for r in slow) > 1.08 * fast_median, label.fault_id
            assert max(r["compute"] for r in fast) < 1.05 * fast_median, label.fault_id
            assert median >= fast_median
            seen.add(label.kind)
    assert len(seen) >= 2, seen


def test_no_table_names_or_says_who_is_guilty(sim) -> None:
    _, store, labels = sim
    words = ("culprit", "inject", "label", "guilt", "ground_truth", "truth", "simulat", "fault_id")
    # the engine's outputs
    telemetry = {t: s for t, s in TABLES.items() if t not in ("incidents", "decisions")}
    for table, schema in telemetry.items():
        for name in schema.names:
            assert not any(w in name.lower() for w in words), (table, name)
    pattern = "culprit|inject|ground.truth|simulat|fault_id|faultlens.labels"
    for table, schema in telemetry.items():
        for field in schema:
            if not pa.types.is_string(field.type):
                continue
            hits = store.query(f'SELECT count(*) AS n FROM "{table}" WHERE '
                               f'regexp_matches(lower("{field.name}"), ?)',
                               [pattern]).column("n")[0].as_py()
            assert hits == 0, (table, field.name)
    ids = [label.fault_id for label in labels]
    text = store.query("SELECT string_agg(coalesce(message, '') || coalesce(traceback, ''), ' ') "
                       "AS t "
                       "FROM process_events").column("t")[0].as_py()
    assert not any(fault_id in text for fault_id in ids)


def test_benign_noise_is_present_and_unlabelled_in_the_store(sim) -> None:
    _, store, labels = sim
    benign = [label for label in labels if label.label_class is LabelClass.BENIGN]
    assert {label.kind for label in benign} >= {
        "benign_app_xid",
        "benign_thermal_blip",
        "benign_gc_pause",
    }
    rank_pids = set(store.query("SELECT pid FROM ranks").column("pid").to_pylist())
    app = store.query("SELECT code, pid, process_name FROM gpu_events WHERE source = 'kmsg' AND "
                      "kind = 'xid' "
                      "AND code IN (13, 31, 43)").to_pylist()
    foreign = [row for row in app if row["pid"] not in rank_pids]
    assert foreign and all(row["process_name"] for row in foreign)
    blips = [label for label in benign if label.kind == "benign_thermal_blip"]
    starts = store.query(
        "SELECT node, ts FROM gpu_events WHERE kind = 'thermal_slowdown_start'"
    ).to_pylist()
    assert any(
        any(
            row["node"] == blip.culprit_nodes[0]
            and abs((row["ts"] - blip.injected_ts).total_seconds()) < 90
            for row in starts
        )
        for blip in blips
    )
    # a one-off slow step: one rank's compute far above its own median for exactly one step
    spikes = (
        store.query(
            "WITH c AS (SELECT attempt, rank, step, "
            "sections['forward'] + sections['backward'] AS x FROM steps WHERE phase = 'train'), "
            "m AS (SELECT attempt, rank, median(x) AS med FROM c GROUP BY ALL) "
            "SELECT count(*) AS n FROM c JOIN m USING (attempt, rank) WHERE c.x > 1.8 * m.med"
        )
        .column("n")[0]
        .as_py()
    )
    assert spikes >= 1


def test_hang_resolution_follows_the_step_program() -> None:
    rng = np.random.default_rng(0)
    placement = Placement(tuple(make_nodes(8, 8, rng)), 8, 4)
    _groups, member_of = build_groups(placement)
    healthy = HangSpec(stuck={}, dead=frozenset(), broken_groups=frozenset())
    posted, done = resolve(placement, 7, healthy, member_of)
    assert all(done[r] == len(posted[r]) for r in posted)  # a healthy step finishes everything
    stuck = HangSpec(stuck={19: 0}, dead=frozenset(), broken_groups=frozenset())
    posted, done = resolve(placement, 7, stuck, member_of)
    assert posted[19] == [] and done[19] == 0
    # its tensor-parallel peers stall in their first collective that needs it
    for peer in range(16, 24):
        if peer != 19:
            first = step_program(peer, 7, placement, member_of)[done[peer]]
            assert first.group == member_of[peer]["tp"] or first.kind == "recv"
    assert sum(done[r] == len(posted[r]) for r in posted) < len(posted) // 2
    nvlink = HangSpec(stuck={}, dead=frozenset(), broken_groups=frozenset({member_of[0]["tp"]}))
    posted, done = resolve(placement, 7, nvlink, member_of)
    assert all(posted[r][done[r]].group == member_of[0]["tp"] for r in range(8))


def test_bad_settings_and_bad_labels_fail_clearly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ConfigError, match="nodes"):
        SimConfig(nodes=1)
    with pytest.raises(ConfigError, match="pp_size"):
        SimConfig(nodes=6, pp_size=4)
    with pytest.raises(ConfigError, match="fault_sequence: unknown fault kind 'gpu_on_fire'"):
        SimConfig(fault_sequence=("hbm_dbe", "gpu_on_fire"))
    bad = tmp_path / "labels.jsonl"
    bad.write_text('{"fault_id": "F1"}\nnot json\n')
    with pytest.raises(LabelError, match=r"labels.jsonl:1: key 'kind' is required"):
        read_labels(bad)
    store = tmp_path / "store"
    store.mkdir()
    (store / "something").write_text("x")
    assert cli(["simulate", "--store", str(store), "--hours", "1"]) == 2
    assert "already holds data" in capsys.readouterr().err
    assert cli(["eval", "--store", str(store), "--labels", str(bad)]) == 2
    assert "labels.jsonl:1" in capsys.readouterr().err


def test_cli_simulate_writes_store_and_labels(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "cli-store"
    labels = tmp_path / "truth.jsonl"
    code = cli(
        [
            "simulate",
            "--store",
            str(store),
            "--nodes",
            "4",
            "--hours",
            "2",
            "--seed",
            "3",
            "--labels",
            str(labels),
            "--faults-per-day",
            "60",
            "--step-seconds",
            "10",
            "--json",
        ]
    )
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["labels"] == str(labels) and summary["rows"]["steps"] > 0
    parsed = read_labels(labels)
    assert sum(1 for label in parsed if label.is_fault) == summary["faults"]
    round_trip = tmp_path / "again.jsonl"
    write_labels(parsed, round_trip)
    assert read_labels(round_trip) == parsed
