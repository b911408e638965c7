"""PyTorch's flight-recorder analyzer test cases (test/distributed/flight_recorder/
test_fr_analysis.py, test_match_one_event: pairs of entries of one all_reduce in a group of two),
written as two-rank dumps in the recorder's own format, with torch's expected answer (torch's
match_one_event runs here on the same pair) beside faultlens'. Where they differ, the case says why
faultlens' answer is the better one."""

from __future__ import annotations

from pathlib import Path

import pytest

from faultlens.attribution.detectors.hang import HangVerdict, analyze_collectives
from faultlens.attribution.policy.config import load_policy
from faultlens.collectors.artifacts.flight_recorder import read_dump_dir
from tests import fr_builders as fb

utils = pytest.importorskip("torch.distributed.flight_recorder.components.utils")
types = pytest.importorskip("torch.distributed.flight_recorder.components.types")
THRESHOLD = load_policy().confidence_threshold
E1 = {
    "op": "all_reduce",
    "sizes": [[4, 4]],
    "out": [[4, 4]],
    "state": "scheduled",
    "dtype": "Float",
}


def _torch_event(spec: dict) -> dict:
    """The event as torch's test writes it (create_one_event)."""
    return {
        "profiling_name": f"nccl:{spec['op']}",
        "state": spec["state"],
        "process_group": ("0", "default"),
        "input_sizes": spec["sizes"],
        "output_sizes": spec["out"],
        "input_dtypes": "float32",
        "output_dtypes": spec.get("out_dtype", "float32"),
        "collective_seq_id": "1",
        "p2p_seq_id": "0",
        "time_created_ns": 0,
        "frames": [],
    }


def _faultlens(tmp_path: Path, specs: tuple[dict, dict]):
    config = fb.pg_config({"0": ("default_pg", (0, 1))})
    dumps = {}
    for rank, spec in enumerate(specs):
        entry = fb.entry(
            record_id=0,
            seq=1,
            op=f"nccl:{spec['op']}",
            sizes=[tuple(s) for s in spec["sizes"]],
            out_sizes=[tuple(s) for s in spec["out"]],
            state=spec["state"],
        )
        if "out_dtype" in spec:
            entry["output_dtypes"] = [spec["out_dtype"]]
        dumps[rank] = fb.dump([entry], config, rank=rank)
    return analyze_collectives(read_dump_dir(fb.write_set(tmp_path, dumps)).table)


# (case, rank 1's entry, torch's expected MatchState, faultlens' verdict, faultlens' ranks)
CASES = [
    # both inside the same collective, nothing completed: the pair matches; faultlens says the
    # group is stuck as a whole and names nobody
    ("e1-e1", {}, "FULLY_MATCHED", HangVerdict.STALLED, ()),
    # all_reduce against all_gather; in a group of two nothing says which side is odd: torch names
    # one rank, faultlens names both, below the failover threshold
    ("e1-e2", {"op": "all_gather"}, "COLLECTIVE_TYPE_MISMATCH", HangVerdict.OP_MISMATCH, (0, 1)),
    ("e1-e5", {"sizes": [[5, 4]]}, "SIZE_OR_SYNTAX_MISMATCH", HangVerdict.SIZE_MISMATCH, (0, 1)),
    # output sizes compared like input sizes
    ("e1-e6", {"out": [[5, 4]]}, "SIZE_OR_SYNTAX_MISMATCH", HangVerdict.SIZE_MISMATCH, (0, 1)),
    # one rank completed it, the other did not: torch says "state mismatch"; faultlens names the
    # rank that is still inside it (it stalled while its peer completed)
    ("e1-e9", {"state": "completed"}, "COLLECTIVE_STATE_MISMATCH", HangVerdict.STALLED, (0,)),
]


@pytest.mark.parametrize(
    ("case", "change", "torch_state", "verdict", "ranks"), CASES, ids=[c[0] for c in CASES]
)
def test_torch_match_one_event_cases(tmp_path, case, change, torch_state, verdict, ranks):
    mine, theirs = E1, {**E1, **change}
    membership = {"0": {0, 1}}
    got = utils.match_one_event(_torch_event(mine), _torch_event(theirs), membership, "0").state
    assert got == getattr(types.MatchState, torch_state)  # torch's own answer, as its test expects
    report = _faultlens(tmp_path, (mine, theirs))
    assert (report.verdict, report.culprit_ranks) == (verdict, ranks), report.reason
    if len(ranks) != 1:
        assert report.confidence < THRESHOLD


def test_torch_output_dtype_case_completed_is_a_collective_mismatch(tmp_path):
    """e10 against e9: both completed, output float16 against float32. torch: a dtype mismatch;
    faultlens: the same finding, and that every member completed it (no hang)."""
    done = {**E1, "state": "completed"}
    half = {**done, "out_dtype": "Half"}
    torch_half = {**done, "out_dtype": "float16"}
    got = utils.match_one_event(_torch_event(torch_half), _torch_event(done), {"0": {0, 1}}, "0")
    assert got.state == types.MatchState.COLLECTIVE_DTYPE_MISMATCH
    report = _faultlens(tmp_path, (half, done))
    assert report.verdict == HangVerdict.COLLECTIVE_MISMATCH and report.culprit_ranks == (0, 1)
    assert report.confidence < THRESHOLD
