"""Evidence sentences agree with their numbers, culprit GPUs are real identifiers or indices.

- A SIGKILLed rank loses its step timer's unflushed rows: the step it died in is one past the last
  step any rank of the attempt completed, not one past its own last flushed row (the demo's "SIGKILL
  at step 17" came out "at step 15").
- A straggler whose slow section hides in the total (its peers wait for it inside theirs) is
  described by that section first, never "compute 1.00x its peers' median" beside "forward 5.70x
  peers".
- Without a GPU UUID or PCI bus id, culprit_gpus holds the GPU index, never an invented
  "node-3:gpu0".
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from faultlens.attribution.engine import Engine, attribute
from faultlens.attribution.incident import IncidentClass
from faultlens.collectors.sources.xid_catalog import load_xid_catalog
from tests.engine_rows import event, ranks_rows, steps_rows, write


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine(catalog=load_xid_catalog())


def _killed(
    store: Path,
    engine: Engine,
    *,
    killed: int,
    peers_last: int,
    own_last: int | None,
    world: int = 4,
    per_node: int = 2,
    index_only: bool = False,
) -> object:
    ranks = ranks_rows("job-1", 0, world, per_node, with_gpu=not index_only)
    # what a CPU job's step timer knows: the local rank as the GPU index, no UUID, no bus id
    if index_only:
        ranks = [{**r, "gpu_index": r["local_rank"]} for r in ranks]
    write(store, "ranks", ranks)
    rows = steps_rows("job-1", 0, world, per_node, range(0, peers_last + 1), start=1.0,
                      sections=lambda rank, step: {"forward": 0.05, "backward": 0.1})
    rows = [
        r for r in rows if r["rank"] != killed or (own_last is not None and r["step"] <= own_last)
    ]
    write(store, "steps", rows)
    t = rows[-1]["end_ts"].timestamp() - rows[0]["start_ts"].timestamp() + 1.5
    write(
        store,
        "process_events",
        [
            event(
                "exit",
                killed,
                t,
                source="torchrun_report",
                exit_code=-9,
                signal="SIGKILL",
                per_node=per_node,
            ),
            *[
                event(
                    "exit",
                    r,
                    t + 2,
                    source="torchrun_report",
                    exit_code=-15,
                    signal="SIGTERM",
                    is_secondary=True,
                    per_node=per_node,
                )
                for r in range(world)
                if r != killed
            ],
        ],
    )
    (incident,) = [
        i for i in attribute(str(store), engine=engine) if i.incident_class == IncidentClass.CRASH
    ]
    return incident


@pytest.mark.parametrize(("killed", "peers_last", "own_last"), [
    (2, 16, 14),     # the demo's case: its last two steps never flushed
    (2, 16, None),   # nothing flushed at all
    (1, 16, 16),     # everything flushed
    (3, 40, 21),     # a long buffer lost
    (0, 3, 1),
])
def test_sigkill_step_is_the_step_the_job_was_in(store_dir, engine, killed, peers_last, own_last):
    incident = _killed(store_dir, engine, killed=killed, peers_last=peers_last, own_last=own_last)
    assert incident.culprit_ranks == (killed,)
    assert incident.step == peers_last + 1
    assert f"killed by SIGKILL at step {peers_last + 1}" in incident.summary


def _straggler(
    store: Path, engine: Engine, *, slow_rank: int, factor: float, world: int = 8, per_node: int = 4
):
    write(store, "ranks", ranks_rows("job-1", 0, world, per_node))

    def sections(rank: int, step: int) -> dict[str, float]:
        forward = 0.05 * (factor if rank == slow_rank and step >= 10 else 1.0)
        # DDP: the peers' backward absorbs the wait for the slow rank's gradients
        return {"forward": forward, "backward": 0.2}

    rows = steps_rows(
        "job-1", 0, world, per_node, range(0, 40), sections=sections, comm_absorbs=False
    )
    slowest = {}
    for r in rows:
        slowest[r["step"]] = max(slowest.get(r["step"], 0.0), r["sections"]["forward"])
    for r in rows:  # peers wait inside backward for as long as the slow rank spends in forward
        r["sections"] = {"forward": r["sections"]["forward"],
                         "backward": 0.2 + slowest[r["step"]] - r["sections"]["forward"]}
    write(store, "steps", rows)
    found = [
        i
        for i in attribute(str(store), engine=engine)
        if i.incident_class == IncidentClass.STRAGGLER
    ]
    return found


@pytest.mark.parametrize("factor", [4.0, 5.7, 8.0])
def test_straggler_sentence_leads_with_the_slow_section_when_the_total_hides_it(
    store_dir, engine, factor
):
    found = _straggler(store_dir, engine, slow_rank=5, factor=factor)
    assert found, "the straggler was not found"
    (incident,) = found
    texts = [e.text for e in incident.evidence if e.text.startswith("rank 5")]
    assert texts
    for text in texts:
        compute = re.search(r"compute (sections together are )?([0-9.]+)x", text)
        section = re.search(r"slowest section forward ([0-9.]+)x peers", text)
        assert section is not None, text
        if compute is not None and float(section.group(1)) > 1.1 * max(
            float(compute.group(2)), 1.0
        ):
            assert text.index("slowest section") < text.index("compute"), text
            assert "wait for it" in text


@pytest.mark.parametrize(
    ("killed", "index_only", "expected"),
    [
        (2, True, ("0",)),
        (3, True, ("1",)),
        (2, False, ("GPU-0100aaaa",)),
        (1, False, ("GPU-0001aaaa",)),
    ],
)
def test_culprit_gpus_are_real_ids_or_indices(store_dir, engine, killed, index_only, expected):
    incident = _killed(
        store_dir, engine, killed=killed, peers_last=10, own_last=8, index_only=index_only
    )
    assert incident.culprit_gpus == expected
    assert not any(":gpu" in gpu for gpu in incident.culprit_gpus)
