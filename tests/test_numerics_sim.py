"""The simulator's silent data corruption (controller/lab/simulate/faults/numerics.py): one flipped
parameter bit on one GPU, no crash; the numerics probe's digests (simulate/numerics_rows.py) show
it on that rank only, and the real engine names the rank and node, the policy fails the node over,
and `faultlens eval` counts it in its own class. With the probe on and no flip: no numerics
incident."""

from __future__ import annotations

from pathlib import Path

import pytest

from faultlens.attribution.engine import attribute
from faultlens.attribution.incident import IncidentClass
from faultlens.controller.cli.main import main as cli
from faultlens.controller.lab.evaluate import evaluate
from faultlens.controller.lab.fault_labels import LabelClass, read_labels
from faultlens.controller.lab.simulate import SimConfig, simulate
from faultlens.controller.lab.simulate.config import ConfigError

# six nodes of two GPUs, two pipeline stages: three data-parallel replicas of each shard
SMALL = dict(nodes=6, gpus_per_node=2, pp_size=2, hours=3.0, stragglers_per_day=0.0)


@pytest.mark.parametrize(("seed", "every"), [(5, 20), (11, 35)])
def test_a_flipped_parameter_bit_is_found_named_and_failed_over(
    tmp_path: Path, seed: int, every: int
) -> None:
    store = tmp_path / "store"
    result = simulate(
        SimConfig(
            seed=seed,
            faults_per_day=48.0,
            benign_per_day=30.0,
            fault_sequence=("sdc_param_flip", "gpu_xid79"),
            numerics_every=every,
            **SMALL,
        ),
        str(store),
    )
    labels = read_labels(result.labels_path)
    flips = [label for label in labels if label.kind == "sdc_param_flip"]
    assert flips and all(label.label_class is LabelClass.NUMERICS for label in flips)
    report = evaluate(labels, attribute(str(store)))
    score = report.per_class[LabelClass.NUMERICS.value]
    assert (score.tp, score.fp, score.fn) == (len(flips), 0, 0)
    for match in report.matches:
        if match.label.kind != "sdc_param_flip":
            continue
        incident = match.incident
        assert incident is not None and incident.incident_class is IncidentClass.NUMERICS
        assert incident.rule == "numerics-digest-mismatch"
        assert incident.culprit_ranks == match.label.culprit_ranks
        assert incident.culprit_nodes == match.label.culprit_nodes
        assert incident.step == match.label.step - every + 1  # certified: the last agreement
    first = min(flips, key=lambda label: label.injected_ts)
    decided = next(m.decision for m in report.matches if m.label.fault_id == first.fault_id)
    assert decided is not None and decided.action == "failover", decided
    assert not report.false_alarms, [fa.incident.summary for fa in report.false_alarms]


def test_the_probe_on_and_no_flip_is_no_numerics_incident(tmp_path: Path) -> None:
    store = tmp_path / "store"
    simulate(
        SimConfig(seed=7, faults_per_day=0.0, benign_per_day=60.0, numerics_every=25, **SMALL),
        str(store),
    )
    found = [i for i in attribute(str(store)) if i.incident_class is IncidentClass.NUMERICS]
    assert found == [], [i.summary for i in found]


def test_the_flip_needs_the_probe(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match="sdc_param_flip needs numerics_every"):
        SimConfig(fault_sequence=("sdc_param_flip",))
    with pytest.raises(ConfigError, match="numerics_every"):
        SimConfig(numerics_every=-1)
    args = ["simulate", "--store", str(tmp_path / "s"), "--hours", "1", "--nodes", "6"]
    assert cli([*args, "--kinds", "sdc_param_flip"]) == 2
    assert "numerics_every" in capsys.readouterr().err
