"""rules/xid.yaml and the catalog API (interface 1)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from faultlens.collectors.sources.xid_catalog import (
    DEFAULT_XID_PATH,
    XidCatalogError,
    XidComponent,
    XidInfo,
    XidScope,
    load_xid_catalog,
)

# every Xid of docs/reference/gpu-signals.md section 1 (119/120, 144-150 and 155/156/158 expanded)
# and Xid 54 (the only CHECK_MECHANICALS one, named in the bucket legend)
REFERENCE_XIDS = [
    13,
    31,
    43,
    45,
    48,
    54,
    61,
    62,
    63,
    64,
    68,
    69,
    74,
    79,
    92,
    94,
    95,
    109,
    119,
    120,
    121,
    140,
    143,
    144,
    145,
    146,
    147,
    148,
    149,
    150,
    154,
    155,
    156,
    158,
]


@pytest.fixture(scope="module")
def catalog():
    return load_xid_catalog()


def test_default_path_is_the_repository_rules_file():
    assert Path(__file__).resolve().parents[1] / "rules" / "xid.yaml" == DEFAULT_XID_PATH


def test_every_reference_xid_is_listed(catalog):
    assert sorted(info.code for info in catalog) == REFERENCE_XIDS


@pytest.mark.parametrize(("code", "name", "component", "action", "leave"), [
    (79, "FALLEN_OFF_THE_BUS", XidComponent.PCIE, "RESTART_BM", XidScope.NODE),
    (48, "GPU_ECC_DBE", XidComponent.HBM, "WORKFLOW_XID_48", XidScope.GPU),
    (13, "GR_EXCEPTION", XidComponent.APPLICATION, "RESTART_APP", XidScope.NONE),
    (63, "DRAM_RETIREMENT_EVENT", XidComponent.HBM, "IGNORE", XidScope.NONE),
    (64, "DRAM_RETIREMENT_FAILURE", XidComponent.HBM, "RESET_GPU", XidScope.GPU),
    (74, "NVLINK_ERROR", XidComponent.NVLINK, "WORKFLOW_NVLINK_ERR", XidScope.GPU),
    (119, "GSP_RPC_TIMEOUT", XidComponent.GSP, "RESET_GPU", XidScope.GPU),
    (150, "NVLINK_MSE_ERROR", XidComponent.NVLINK, "RESET_GPU", XidScope.GPU),
    (149, "NVLINK_NETIR_ERROR", XidComponent.NVLINK, "WORKFLOW_NVLINK5_ERR", XidScope.UNKNOWN),
    (154, "RECOVERY_ACTION_CHANGED", XidComponent.GPU, "XID_154", XidScope.UNKNOWN),
])
def test_entries(catalog, code, name, component, action, leave):
    assert catalog.get(code) == XidInfo(
        code=code, name=name, component=component, action=action, leave=leave
    )


def test_unlisted_code_is_unknown(catalog):
    info = catalog.get(9999)
    assert info.component is XidComponent.UNKNOWN
    assert info.leave is XidScope.UNKNOWN
    assert 9999 not in catalog


def test_application_errors_follow_the_device_plugin(catalog):
    assert {code for code in REFERENCE_XIDS if catalog.is_application_error(code)} == {
        13,
        31,
        43,
        45,
        68,
    }


def test_hardware_xids_never_say_none(catalog):
    for code in (48, 62, 64, 79, 95, 119, 120, 140, 143):
        assert catalog.get(code).leave in (XidScope.GPU, XidScope.NODE)


def _write(tmp_path: Path, document: object) -> Path:
    path = tmp_path / "xid.yaml"
    path.write_text(yaml.safe_dump(document) if not isinstance(document, str) else document)
    return path


def _good() -> dict:
    return yaml.safe_load(DEFAULT_XID_PATH.read_text())


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (
            lambda d: d["xids"][3].update(leave="rack"),
            ["xids[3].leave: expected one of none, gpu, node, unknown, got 'rack'"],
        ),
        (lambda d: d["xids"][0].pop("component"), ["xids[0].component: required key is missing"]),
        (
            lambda d: d["xids"][1].update(code="31"),
            ["xids[1].code: expected a valid integer, got '31'"],
        ),
        (lambda d: d.update(format_version=2), ["format_version: expected 1, got 2"]),
        (
            lambda d: d["xids"][2].update(colour="red"),
            ["xids[2].colour: unknown key (not allowed here)"],
        ),
        (
            lambda d: d["xids"].append(dict(d["xids"][0])),
            ["xids[34].code", "expected a unique Xid, 13 is already at xids[0]"],
        ),
    ],
)
def test_bad_catalog_names_file_key_and_expectation(tmp_path, mutate, expected):
    document = _good()
    mutate(document)
    path = _write(tmp_path, document)
    with pytest.raises(XidCatalogError) as caught:
        load_xid_catalog(path)
    message = str(caught.value)
    assert message.startswith(str(path) + ": ")
    for part in expected:
        assert part in message


def test_not_yaml(tmp_path):
    path = _write(tmp_path, "format_version: 1\nxids: [ {code: 13\n")
    with pytest.raises(XidCatalogError, match=r"xid\.yaml: line \d+, column \d+: not valid YAML"):
        load_xid_catalog(path)


def test_missing_file(tmp_path):
    with pytest.raises(XidCatalogError, match="cannot read"):
        load_xid_catalog(tmp_path / "nope.yaml")
