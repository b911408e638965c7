"""rules/xid.yaml and the catalog API (interface 1)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from faultlens.collectors.sources.xid_catalog import (
    DEFAULT_XID_PATH,
    XidCatalogError,
    XidComponent,
    XidScope,
    load_xid_catalog,
)

# NVIDIA's Xid catalog for Ampere and newer (docs.nvidia.com/deploy/xid-errors, "Catalog" sheet,
# October 2025) lists every code from 1 to 172
NVIDIA_XIDS = list(range(1, 173))
# a sample of NVIDIA's rows, written out from the catalog page: (code, mnemonic, immediate bucket)
NVIDIA_ROWS = [
    (13, "ROBUST_CHANNEL_GR_EXCEPTION", "RESTART_APP"),
    (46, "ROBUST_CHANNEL_GPU_TIMEOUT_ERROR", "RESET_GPU"),
    (54, "SILENT_RUNNING_PWR_REDUCED_CLOCKING", "CHECK_MECHANICALS"),
    (79, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "RESTART_BM"),
    (110, "SEC_FAULT_ERROR", "RESET_GPU"),
    (136, "ALI_TRAINING_FAIL", "RESET_GPU"),
    (150, "NVLINK_MSE_ERROR", "WORKFLOW_NVLINK5_ERR"),
    (151, "ROBUST_CHANNEL_KEY_ROTATION_ERROR", "RESTART_VM"),
    (155, "NVLINK_SW_DEFINED_ERROR", "RESET_GPU"),
    (156, "RESOURCE_RETIREMENT_EVENT", "RESET_GPU"),
    (158, "GPU_FATAL_TIMEOUT", "RESET_GPU"),
    (159, "ROBUST_CHANNEL_CHI_NON_DATA_ERROR", "CHECK_UVM"),
    (167, "PCIE_FATAL_TIMEOUT", "UNSPECIFIED"),
    (171, "UNCORRECTABLE_DRAM_ERROR", "UNSPECIFIED"),
    (172, "UNCORRECTABLE_SRAM_ERROR", "UNSPECIFIED"),
]


@pytest.fixture(scope="module")
def catalog():
    return load_xid_catalog()


def test_default_path_is_the_repository_rules_file():
    assert Path(__file__).resolve().parents[1] / "rules" / "xid.yaml" == DEFAULT_XID_PATH


def test_every_xid_nvidia_lists_is_present(catalog):
    assert sorted(info.code for info in catalog) == NVIDIA_XIDS


@pytest.mark.parametrize(("code", "name", "action"), NVIDIA_ROWS)
def test_rows_follow_nvidia(catalog, code, name, action):
    info = catalog.get(code)
    assert (info.name, info.action) == (name, action)


def test_every_row_is_complete():
    document = _good()
    for row in document["xids"]:
        for key in (
            "code",
            "name",
            "description",
            "component",
            "action",
            "investigatory",
            "leave",
            "hardware",
        ):
            assert row.get(key) not in (None, ""), (row["code"], key)
        assert isinstance(row["hardware"], bool)
        # what leaves follows NVIDIA's immediate bucket
        if row["description"] == "Unused":
            assert not row["hardware"], row["code"]
        if row["action"] in ("IGNORE", "RESTART_APP"):
            assert row["leave"] == "none", row["code"]
        if row["action"] == "RESET_GPU":
            assert row["leave"] == "gpu" and row["hardware"], row["code"]


@pytest.mark.parametrize(
    ("code", "name", "component", "action", "leave", "hardware"),
    [
        (
            79,
            "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS",
            XidComponent.PCIE,
            "RESTART_BM",
            XidScope.NODE,
            True,
        ),
        (48, "ROBUST_CHANNEL_GPU_ECC_DBE", XidComponent.HBM, "WORKFLOW_XID_48", XidScope.GPU, True),
        (
            13,
            "ROBUST_CHANNEL_GR_EXCEPTION",
            XidComponent.APPLICATION,
            "RESTART_APP",
            XidScope.NONE,
            False,
        ),
        (63, "INFOROM_DRAM_RETIREMENT_EVENT", XidComponent.HBM, "IGNORE", XidScope.NONE, True),
        (64, "INFOROM_DRAM_RETIREMENT_FAILURE", XidComponent.HBM, "RESET_GPU", XidScope.GPU, True),
        (74, "NVLINK_ERROR", XidComponent.NVLINK, "WORKFLOW_NVLINK_ERR", XidScope.GPU, True),
        (119, "GSP_RPC_TIMEOUT", XidComponent.GSP, "RESET_GPU", XidScope.GPU, True),
        (150, "NVLINK_MSE_ERROR", XidComponent.NVLINK, "WORKFLOW_NVLINK5_ERR", XidScope.GPU, True),
        (
            149,
            "NVLINK_NETIR_ERROR",
            XidComponent.NVLINK,
            "WORKFLOW_NVLINK5_ERR",
            XidScope.UNKNOWN,
            True,
        ),
        (154, "GPU_RECOVERY_ACTION_CHANGED", XidComponent.GPU, "XID_154", XidScope.UNKNOWN, False),
        (46, "ROBUST_CHANNEL_GPU_TIMEOUT_ERROR", XidComponent.GPU, "RESET_GPU", XidScope.GPU, True),
        (
            39,
            "ROBUST_CHANNEL_CE0_ERROR",
            XidComponent.APPLICATION,
            "RESTART_APP",
            XidScope.NONE,
            False,
        ),
    ],
)
def test_entries(catalog, code, name, component, action, leave, hardware):
    info = catalog.get(code)
    assert (info.code, info.name, info.component, info.action, info.leave, info.hardware) == (
        code,
        name,
        component,
        action,
        leave,
        hardware,
    )


# GPUd marks 63, 68, 69, 94 and 121 fatal (reboot) and GCM calls 69, 94 and 121 critical;
# faultlens follows NVIDIA (none of them needs the GPU out of the job) and says so on the row
@pytest.mark.parametrize(
    ("code", "peers"),
    [
        (63, ["GPUd"]),
        (68, ["GPUd"]),
        (69, ["GPUd", "GCM"]),
        (94, ["GPUd", "GCM"]),
        (121, ["GPUd", "GCM"]),
    ],
)
def test_peer_disagreements_follow_nvidia_and_say_so(catalog, code, peers):
    row = next(r for r in _good()["xids"] if r["code"] == code)
    assert all(peer in row["peers"] for peer in peers)
    assert catalog.get(code).leave is XidScope.NONE
    assert catalog.get(code).action in ("IGNORE", "RESTART_APP")


def test_unlisted_code_is_unknown(catalog):
    info = catalog.get(9999)
    assert info.component is XidComponent.UNKNOWN
    assert info.leave is XidScope.UNKNOWN
    assert 9999 not in catalog


def test_application_errors_follow_the_device_plugin(catalog):
    assert {code for code in NVIDIA_XIDS if catalog.is_application_error(code)} == {
        13,
        31,
        43,
        45,
        68,
    }


def test_hardware_xids_never_say_none(catalog):
    for code in (46, 48, 62, 64, 79, 95, 109, 110, 119, 120, 136, 140, 143, 150, 155, 156, 158):
        assert catalog.get(code).leave in (XidScope.GPU, XidScope.NODE)
        assert catalog.get(code).hardware


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
            ["xids[172].code", "expected a unique Xid, 1 is already at xids[0]"],
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
