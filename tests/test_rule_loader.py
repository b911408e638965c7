"""One loader, one error shape (issue 14): a mistake in any kind of rule file (copies of the real
files) gives one line `<file>: <field path>: expected ..., got ...`, and the CLI prints it as one
line and exits 2."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from faultlens.attribution.detectors.straggler.vocab import load_vocabulary
from faultlens.attribution.policy import load_policy
from faultlens.attribution.rules import load_crash_rules, load_thresholds
from faultlens.collectors.rule_loader import RuleFileError
from faultlens.collectors.sources.process_rules import load_process_rules
from faultlens.collectors.sources.recorded_backend import load_timeline
from faultlens.collectors.sources.xid_catalog import load_xid_catalog
from faultlens.controller.hooks.config import load_hooks
from faultlens.controller.lab.scenarios import load_campaign
from faultlens.errors import FaultlensError
from tests.conftest import REPO_ROOT

RULES = REPO_ROOT / "rules"

# (file, loader, (old, new) edit of the real file, the field path and expectation the one line must
# hold)
CASES = [
    ("policy.yaml", load_policy, ("when: {class: [health]}", "when: {class: [crsh]}"),
     r"rules\[\d+\]\.when\.class\[0\]: expected one of crash, .*collective_hang.*, got 'crsh'$"),
    ("crash.yaml", load_crash_rules, ("  before_s: ", "  before_z: "),
     r"hardware_window\.before_s: required key is missing"),
    ("thresholds.yaml", load_thresholds, ("  persistence: ", "  persistence: 7 #"),
     r"straggler\.persistence: expected less than or equal to 1, got 7$"),
    ("process_errors.yaml", lambda p: load_process_rules(str(p)), ("kind: oom", "kind: moo"),
     r"patterns\[\d+\]\.kind: expected one of .*got 'moo'$"),
    ("hooks.example.yaml", load_hooks, ("type: webhook", "type: pigeon"),
     r"hooks\[0\]\.type: expected one of webhook, command, file, entry_point, slurm, alertmanager, "
     r"got 'pigeon'$"),
    ("xid.yaml", load_xid_catalog, ("leave: node", "leave: rack"),
     r"xids\[\d+\]\.leave: expected one of none, gpu, node, unknown, got 'rack'$"),
    ("comm_ops.yaml", lambda p: load_vocabulary([p]), ("kind: comm", "kind: chat"),
     r"kinds\[\d+\]\.kind: expected one of .*got 'chat'$"),
    ("campaign.yaml", load_campaign, ("format_version: 1", "format_version: 3"),
     r"format_version: expected 1, got 3$"),
]


def _shape(path, tail: str) -> re.Pattern[str]:
    return re.compile(re.escape(str(path)) + ": " + tail)


@pytest.mark.parametrize(("name", "loader", "edit", "expected"), CASES, ids=[c[0] for c in CASES])
def test_a_mistake_in_each_kind_of_rule_file_is_one_line_naming_file_and_field(
    tmp_path, name, loader, edit, expected
):
    text = (RULES / name).read_text()
    assert edit[0] in text, f"{name} no longer holds {edit[0]!r}: update the case"
    path = tmp_path / name
    path.write_text(text.replace(edit[0], edit[1], 1))
    with pytest.raises(RuleFileError) as caught:
        loader(path)
    message = str(caught.value)
    assert "\n" not in message
    assert _shape(path, expected).match(message), message
    assert isinstance(caught.value, (ValueError, FaultlensError))


def test_a_bad_gpu_timeline_is_one_line_of_the_same_shape(tmp_path):
    text = (REPO_ROOT / "tests" / "data" / "gpu" / "timeline-8gpu.yaml").read_text()
    path = tmp_path / "timeline.yaml"
    path.write_text(text.replace("format_version: 1", "format_version: 1\nfan_rpm: 3", 1))
    with pytest.raises(RuleFileError) as caught:
        load_timeline(path)
    assert str(caught.value) == f"{path}: fan_rpm: unknown key (not allowed here)"


@pytest.mark.parametrize("name", ["policy.yaml", "xid.yaml", "crash.yaml", "hooks.example.yaml"])
def test_not_yaml_and_missing_files_have_the_same_shape_in_every_loader(tmp_path, name):
    loader = next(c[1] for c in CASES if c[0] == name)
    path = tmp_path / name
    path.write_text("format_version: 1\nrules: [\n")
    with pytest.raises(RuleFileError, match=re.escape(str(path)) + r": line \d+, column \d+: not "
                                                                   r"valid YAML: "):
        loader(path)
    with pytest.raises(
        RuleFileError, match=re.escape(str(tmp_path / "nope.yaml")) + ": cannot read: "
    ):
        loader(tmp_path / "nope.yaml")


def test_cli_prints_a_policy_mistake_as_one_line_and_exits_2(tmp_path, store_dir):
    path = tmp_path / "policy.yaml"
    path.write_text(
        (RULES / "policy.yaml")
        .read_text()
        .replace("when: {class: [health]}", "when: {class: [crsh]}", 1)
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "faultlens.controller.cli.main",
            "decide",
            "--store",
            str(store_dir),
            "--policy",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"faultlens decide: error: {path}: rules[")
    assert "expected one of crash" in lines[0] and "got 'crsh'" in lines[0]


@pytest.mark.parametrize(("text", "expected"), [
    # a pattern reads as the text it must match; a tagged union's tag is no part of the field path
    ("format_version: 1\nhooks:\n  - {type: file, name: 'bad name!', directory: /x}\n",
     r"hooks\[0\]\.name: expected text matching \^\[A-Za-z0-9_\.-\]\{1,64\}\$, got 'bad name!'$"),
    ("format_version: 1\nhooks:\n  - {type: webhook, url: 'http://x', retry: {attempts: 0}}\n",
     r"hooks\[0\]\.retry\.attempts: expected greater than or equal to 1, got 0$"),
    # no coercion: a quoted number is no number
    ("format_version: 1\nhooks:\n  - {type: command, command: x, timeout_s: '5'}\n",
     r"hooks\[0\]\.timeout_s: expected a valid number, got '5'$"),
])
def test_model_problems_name_the_field_as_the_file_spells_it(tmp_path, text, expected):
    path = tmp_path / "hooks.yaml"
    path.write_text(text)
    with pytest.raises(RuleFileError) as caught:
        load_hooks(path)
    assert _shape(path, expected).match(str(caught.value)), str(caught.value)


def test_a_timeline_step_that_does_nothing_is_refused():
    document = load_timeline(REPO_ROOT / "tests" / "data" / "gpu" / "timeline-8gpu.yaml")
    document["timeline"].append({"at": 1, "gpu": 0})
    from faultlens.collectors.sources.recorded_backend import validate_timeline

    with pytest.raises(RuleFileError, match=r"^t: timeline\[\d+\]: expected at least one of set, "
                                            r"event, lost, "
                                            r"reset_required$"):
        validate_timeline(document, "t")
