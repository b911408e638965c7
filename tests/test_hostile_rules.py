"""Broken rules files (issue 16): 20,000-deep nesting, UTF-16/UTF-32 text, alias bombs give one
clean line naming the file, from every loader of rules/*.yaml (copies of the real files), and
rules/xid.yaml is user-replaceable like the others (--xid-catalog, $FAULTLENS_XID_CATALOG)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from faultlens.attribution.policy import load_policy
from faultlens.attribution.rules import load_crash_rules, load_thresholds
from faultlens.collectors.sources.process_rules import load_process_rules
from faultlens.collectors.sources.xid_catalog import load_xid_catalog
from faultlens.controller.hooks.config import load_hooks
from tests.conftest import REPO_ROOT

RULES = REPO_ROOT / "rules"
LOADERS = {
    "crash.yaml": load_crash_rules,
    "thresholds.yaml": load_thresholds,
    "thresholds-demo.yaml": load_thresholds,
    "policy.yaml": load_policy,
    "process_errors.yaml": lambda path: load_process_rules(str(path)),
    "hooks.example.yaml": load_hooks,
    "xid.yaml": load_xid_catalog,
}
DEEP = 20_000


def _copy_rules(tmp_path):
    for name in LOADERS:
        shutil.copy(RULES / name, tmp_path / name)
    return tmp_path


def _variants(text: str) -> dict[str, bytes]:
    return {
        "deep_flow_sequence": (text + "\ndeep_key: " + "[" * DEEP + "]" * DEEP + "\n").encode(),
        "deep_flow_mapping": (
            text + "\ndeep_key: " + "{a: " * DEEP + "1" + "}" * DEEP + "\n"
        ).encode(),
        "deep_only": ("[" * DEEP + "]" * DEEP + "\n").encode(),
        # 4 MiB of one flow sequence (2 million nodes): refused by its node count, not built
        "wide_flow_sequence": (text + "\nwide_key: [" + "1," * 2_000_000 + "1]\n").encode()[
            : 4 * 1024 * 1024 - 2
        ]
        + b"]\n",
        "utf16_le_bom": text.encode("utf-16"),
        "utf16_be_bom": b"\xfe\xff" + text.encode("utf-16-be"),
        "utf16_no_bom": text.encode("utf-16-le"),
        "utf32": text.encode("utf-32"),
        "alias_bomb": (
            "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
            + "".join(
                f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]\n"
                for i in range(9)
            )
            + "format_version: 1\n"
        ).encode(),
    }


@pytest.mark.parametrize("name", list(LOADERS))
def test_every_rules_loader_gives_one_line_naming_the_file(tmp_path, name):
    _copy_rules(tmp_path)
    text = (RULES / name).read_text()
    for variant, data in _variants(text).items():
        path = tmp_path / f"{variant}-{name}"
        if name == "thresholds-demo.yaml":
            path = tmp_path / f"{variant}-thresholds-demo.yaml"
        path.write_bytes(data)
        with pytest.raises(ValueError) as caught:
            LOADERS[name](path)
        message = str(caught.value)
        assert str(path) in message, (variant, message)
        assert "\n" not in message and "Recursion" not in message, (variant, message)
        if variant.startswith("utf"):
            assert "UTF-8" in message, (variant, message)


def test_a_utf8_bom_is_accepted(tmp_path):
    path = tmp_path / "crash.yaml"
    path.write_bytes(b"\xef\xbb\xbf" + (RULES / "crash.yaml").read_bytes())
    assert load_crash_rules(path).signatures


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT), **extra}


def test_cli_reports_a_deep_rules_file_in_one_line(tmp_path, store_dir):
    path = tmp_path / "crash.yaml"
    path.write_bytes(_variants((RULES / "crash.yaml").read_text())["deep_flow_sequence"])
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "faultlens.controller.cli.main",
            "attribute",
            "--store",
            str(store_dir),
            "--rules",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
        cwd=REPO_ROOT,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and "Traceback" not in result.stderr


def test_xid_catalog_is_user_replaceable(tmp_path, monkeypatch):
    text = (RULES / "xid.yaml").read_text()
    shipped = load_xid_catalog()
    assert shipped.get(79).name != "SITE_NAME_FOR_XID_79"
    user = tmp_path / "my-xid.yaml"
    user.write_text(text.replace(f"name: {shipped.get(79).name}", "name: SITE_NAME_FOR_XID_79", 1))
    assert load_xid_catalog(user).get(79).name == "SITE_NAME_FOR_XID_79"
    monkeypatch.setenv("FAULTLENS_XID_CATALOG", str(user))
    assert load_xid_catalog().get(79).name == "SITE_NAME_FOR_XID_79"
    from faultlens.attribution.hardware import default_xid_catalog

    assert default_xid_catalog().get(79).name == "SITE_NAME_FOR_XID_79"  # what the engine uses


def test_cli_xid_catalog_option_names_a_bad_file(tmp_path, store_dir):
    bad = tmp_path / "xid.yaml"
    bad.write_bytes((RULES / "xid.yaml").read_text().encode("utf-16"))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "faultlens.controller.cli.main",
            "attribute",
            "--store",
            str(store_dir),
            "--xid-catalog",
            str(bad),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
        cwd=REPO_ROOT,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(bad) in lines[0] and "UTF-16" in lines[0]
