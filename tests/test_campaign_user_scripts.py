"""The campaign's "user scripts" family (rules/campaign.yaml, issue 33): users' own scripts
(tests/torch_jobs/user_scripts/), none of them the campaign's two jobs, each healthy with and
without a CPU hog, each with one slow worker to fail over, and a slow pipeline stage to notify. The
lab runs a script configured by its environment (a scenario's `env`, its length `steps`) and tells
the supervisor how long a slowdown's failover waits for a checkpoint boundary (`checkpoint_wait_s`:
these scripts write no checkpoint faultlens knows). The runs themselves are bench_campaign.py's
(`--only user-...`); here the file, the command and the environment the lab builds from it."""

from __future__ import annotations

from pathlib import Path

import pytest

from faultlens.controller.lab.runner import RunArtifacts, run_command, scenario_env
from faultlens.controller.lab.scenarios import ScenarioError, load_campaign

USER = "tests/torch_jobs/user_scripts"


def _family():
    return [s for s in load_campaign().scenarios if s.name.startswith("user-")]


def test_the_family_covers_every_user_script_healthy_hogged_and_slow():
    family = _family()
    scripts = {Path(s.script).name for s in family}
    assert scripts == {
        "ddp_dataloader.py",
        "pipeline_waits.py",
        "tp_dp.py",
        "megatron_timers.py",
    }
    assert all(Path(s.script).parent.as_posix().endswith(USER) for s in family)
    for script in scripts:
        mine = [s for s in family if Path(s.script).name == script]
        healthy = [s for s in mine if s.truth.healthy]
        assert {s.cpu_hog > 0 for s in healthy} == {True, False}, script
        slow = [s for s in mine if not s.truth.healthy and s.faults[0].rank is not None]
        assert [e.action for s in slow for e in s.truth.incidents] == ["failover"], script
    stage = [s for s in family if any(f.stage is not None for f in s.faults)]
    assert [(e.action, e.culprit) for s in stage for e in s.truth.incidents] == [("notify", "none")]
    # each stands for the start of a long job (declared in STEPS) that stops after `steps` (the
    # truth's "finished" needs it)
    assert all(0 < s.steps == int(s.env["EXIT_INTERVAL"]) < int(s.env["STEPS"]) for s in family)


def test_the_lab_passes_the_scripts_environment_and_checkpoint_wait(tmp_path):
    scenario = next(s for s in _family() if s.name == "user-tp-dp-slow-worker")
    env = scenario_env(scenario, tmp_path / "lab", tmp_path / "plan.json")
    assert (env["STEPS"], env["EXIT_INTERVAL"]) == ("100000", "70")
    assert env["PYTHONPATH"].split(":")[0].endswith("controller/lab/site")
    art = RunArtifacts(
        scenario.name, tmp_path, tmp_path / "store", tmp_path / "work", tmp_path / "lab", "j"
    )
    command = run_command(scenario, art)
    assert command[command.index("--checkpoint-wait") + 1] == "5"
    assert command[command.index("--") + 1] == scenario.script
    # the campaign's own jobs keep the supervisor's default wait
    ddp = next(s for s in load_campaign().scenarios if s.name == "slow-rank")
    assert "--checkpoint-wait" not in run_command(ddp, art) and not ddp.env


@pytest.mark.parametrize("env", ["[STEPS]", "{STEPS: [1, 2]}", "7"])
def test_a_bad_env_is_one_line_naming_the_scenario(tmp_path, env):
    text = Path(load_campaign().source).read_text()
    old = 'env: {STEPS: "100000", EXIT_INTERVAL: "70"}'
    assert old in text
    path = tmp_path / "campaign.yaml"
    path.write_text(text.replace(old, f"env: {env}", 1))
    with pytest.raises(ScenarioError) as caught:
        load_campaign(path)
    message = str(caught.value)
    assert "\n" not in message and "user-dataloader-slow-worker.env" in message
