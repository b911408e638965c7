"""The peers' own kernel-log test cases, ported with their expected answers: GPUd's kernel-message
and Xid tests (leptonai/gpud components/accelerator/nvidia/xid/kmsg_test.go and
nvlink_logs_test.go), NVIDIA NVSentinel's fallen-off-the-bus syslog fixtures
(health-monitors/syslog-health-monitor/pkg/gpufallen/gpufallen_handler_test.go) and Meta GCM's
dmesg Xid fixtures (gcm/tests/health_checks_tests/test_check_syslogs.py). Each line is the peer's
verbatim; where faultlens answers differently from the peer, the case says why."""

from __future__ import annotations

import datetime as dt

import pytest

from faultlens.collectors.sources.kmsg import KernelLogParser
from faultlens.collectors.sources.xid_catalog import XidScope, load_xid_catalog

UTC = dt.UTC
NOW = dt.datetime(2026, 11, 30, 12, 0, tzinfo=UTC).timestamp()


@pytest.fixture(scope="module")
def catalog():
    return load_xid_catalog()


def parse(lines, catalog=None):
    parser = KernelLogParser(tz=UTC, now=lambda: NOW, catalog=catalog)
    return parser, parser.feed_lines(lines)


def kinds(events):
    return [(e.kind, e.code, e.pci_bus_id) for e in events]


# -- GPUd kmsg_test.go TestMatch / TestExtractNVRMXid: (input, GPUd's Xid, GPUd's device)
GPUD_MATCH = [
    (
        "NVRM: Xid (PCI:0000:05:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the "
        "bus.",
        79,
        "00000000:05:00.0",
    ),
    (
        "[111111111.111] NVRM: Xid (PCI:0000:05:00): 79, pid='<unknown>', name=<unknown>, GPU has "
        "fallen off the bus.",
        79,
        "00000000:05:00.0",
    ),
    ("NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.", 79, "00000000:01:00.0"),
    ("[...] NVRM: Xid (0000:03:00): 14, Channel 00000001", 14, "00000000:03:00.0"),
    ("NVRM: Xid (0000:03:00): 14, Channel 00000001", 14, "00000000:03:00.0"),
    (
        "[171167.620236] NVRM: Xid (PCI:0009:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 "
        "(0x021425c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
        149,
        "00000009:01:00.0",
    ),
    (
        "[171167.621162] NVRM: Xid (PCI:0009:01:00): 154, GPU recovery action changed from 0x0 "
        "(None) to 0x4 (Drain and Reset)",
        154,
        "00000009:01:00.0",
    ),
    (
        "[171167.630899] NVRM: Xid (PCI:0008:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 "
        "(0x021425c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
        149,
        "00000008:01:00.0",
    ),
    (
        "[171167.897562] NVRM: Xid (PCI:0019:01:00): 154, GPU recovery action changed from 0x4 "
        "(Drain and Reset) to 0x1 (GPU Reset Required)",
        154,
        "00000019:01:00.0",
    ),
    (
        "[171167.969026] NVRM: Xid (PCI:0009:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 00 "
        "(0x021405c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
        149,
        "00000009:01:00.0",
    ),
    (
        "[171168.109293] NVRM: Xid (PCI:0009:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 15 "
        "(0x0215e5c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
        149,
        "00000009:01:00.0",
    ),
    (
        "[171168.409446] NVRM: Xid (PCI:0008:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 14 "
        "(0x0215c5c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
        149,
        "00000008:01:00.0",
    ),
    (
        "[171168.537473] NVRM: Xid (PCI:0018:01:00): 154, GPU recovery action changed from 0x4 "
        "(Drain and Reset) to 0x1 (GPU Reset Required)",
        154,
        "00000018:01:00.0",
    ),
]


@pytest.mark.parametrize(("line", "code", "pci"), GPUD_MATCH)
def test_gpud_xid_lines(line, code, pci):
    _, events = parse([line])
    assert (events[0].kind, events[0].code, events[0].pci_bus_id) == ("xid", code, pci)


def test_gpud_netir_link_fatal_lines_need_a_gpu_reset():
    """GPUd reads these 149s as fatal; NVIDIA's decode (intrInfo bits 25..20 = 0x21, low bits
    NETIR_LINK_EVT) says RESET_GPU, INVESTIGATE_PEER_DEVICE: each gets a GPU-reset recovery
    action at once, not only when a later Xid 154 comes."""
    lines = [line for line, code, _ in GPUD_MATCH if code == 149]
    _, events = parse(lines)
    actions = [e for e in events if e.kind == "recovery_action"]
    assert [(e.code, e.pci_bus_id) for e in actions] == [
        (1, "00000009:01:00.0"),
        (1, "00000008:01:00.0"),
        (1, "00000009:01:00.0"),
        (1, "00000009:01:00.0"),
        (1, "00000008:01:00.0"),
    ]
    assert all("RESET_GPU" in e.message and "INVESTIGATE_PEER_DEVICE" in e.message for e in actions)


@pytest.mark.parametrize(
    ("lines", "pci"),
    [
        # GPUd: "multiline fallen-off-bus fallback without explicit Xid" -> Xid 79 at PCI:0000:18:00
        (
            [
                "NVRM: The NVIDIA GPU 0000:18:00.0",
                "NVRM: (PCI ID: 10de:2901) installed in this system has",
                "NVRM: fallen off the bus and is not responding to commands.",
            ],
            "00000000:18:00.0",
        ),
        # GPUd: "single-line fallen-off-bus fallback without explicit Xid"
        (["NVRM: GPU 0000:29:00.0: GPU has fallen off the bus."], "00000000:29:00.0"),
        # GPUd: "single-line fallen-off-bus fallback normalizes missing PCI domain"
        (["NVRM: GPU 18:00.0: GPU has fallen off the bus."], "00000000:18:00.0"),
    ],
)
def test_gpud_fallen_off_the_bus_forms(lines, pci):
    _, events = parse(lines)
    assert kinds(events) == [("gpu_lost", None, pci)]


def test_gpud_fallen_off_the_bus_without_a_pci_id_is_kept_for_the_node():
    """GPUd drops "The NVIDIA GPU invalid-bdf.0 ... fallen off the bus" (no valid BDF). faultlens
    keeps a gpu_lost row without a PCI id: a GPU of this node was lost, which still implicates the
    node (the crash rules weigh a row without a GPU at node level)."""
    _, events = parse(
        [
            "NVRM: The NVIDIA GPU invalid-bdf.0",
            "NVRM: fallen off the bus and is not responding to commands.",
        ]
    )
    assert kinds(events) == [("gpu_lost", None, None)]


@pytest.mark.parametrize(
    "line",
    [
        "Regular log content without Xid errors",
        "NVRM: Xid error: xyz, invalid data",  # GPUd: nil; faultlens: no event, a counted bad line
        "NVRM: Xid (invalid): some error",  # GPUd: no device; faultlens: no Xid number, a bad line
    ],
)
def test_gpud_lines_that_are_not_xids(line):
    _, events = parse([line])
    assert events == []


def test_gpud_unknown_xid_number_is_kept():
    """GPUd returns nil for `Xid ...: 99999, unknown error` (no catalog detail). faultlens keeps
    the event: the driver reported an error on that GPU whatever the catalog knows of it."""
    _, events = parse(["NVRM: Xid (PCI:0000:05:00): 99999, unknown error"])
    assert kinds(events) == [("xid", 99999, "00000000:05:00.0")]


# -- GPUd nvlink_logs_test.go Test_NVLinkLogCoverage: (line, GPUd's event type, NVIDIA's
# resolution from the catalog's "XID 144-150 Decode" sheet, NVIDIA's severity)
_L = "NVRM: Xid (PCI:0000:04:00): "
GPUD_NVLINK5 = [
    (
        _L + "144, SAW_MVB Nonfatal XC0 i0 Link 00 (0x00000001 0x00000001 0x00000000 0x00000000)",
        "warning",
        "IGNORE",
        "Non-fatal",
    ),
    (
        _L + "144, SAW_MVB Fatal XC0 i0 Link 00 (0x00000001 0x00000002 0x00000000 0x00000000)",
        "fatal",
        "RESET_GPU",
        "Fatal",
    ),
    (
        _L + "145, RLW_CTRL Nonfatal XC0 i0 Link 00 (0x00000003 0x80000000 0x00000000 0x00000000)",
        "warning",
        "IGNORE",
        "Non-fatal",
    ),
    (
        _L + "145, RLW_REMAP Nonfatal XC0 i0 Link 00 (0x00000004 0x00000001 0x00000000 0x00000000)",
        "warning",
        "XID_154_EVAL",
        "Non-fatal",
    ),
    (
        _L + "145, RLW_REMAP Fatal XC0 i0 Link 00 (0x00000004 0x00000040 0x00000000 0x00000000)",
        "fatal",
        "RESET_GPU",
        "Fatal",
    ),
    (
        _L + "145, RLW_REMAP Nonfatal XC0 i0 Link 00 (0x00000004 0x00000100 0x00000000 0x00000000)",
        "warning",
        "IGNORE",
        "Non-fatal",
    ),
    (
        _L
        + "145, RLW_RSPCOL Nonfatal XC0 i0 Link 00 (0x00000005 0x00000001 0x00000000 0x00000000)",
        "warning",
        "IGNORE",
        "Non-fatal",
    ),
    (
        _L + "145, RLW_RSPCOL Fatal XC0 i0 Link 00 (0x00000005 0x00000002 0x00000000 0x00000000)",
        "fatal",
        "RESET_GPU",
        "Fatal",
    ),
    (
        _L
        + "145, RLW_RXPIPE Nonfatal XC0 i0 Link 00 (0x00000006 0x00000001 0x00000000 0x00000000)",
        "warning",
        "IGNORE",
        "Non-fatal*",
    ),
    (
        _L + "145, RLW_SRC_TRACK Fatal XC0 i0 Link 00 (0x00000007 0x00000001 0x00000000 "
        "0x00000000)",
        "fatal",
        "RESET_GPU",
        "Fatal",
    ),
    (
        _L + "145, RLW_SRC_TRACK Nonfatal XC0 i0 Link 00 (0x00000007 0x00000002 0x00000000 "
        "0x00000000)",
        "warning",
        "IGNORE",
        "Non-fatal",
    ),
    (
        _L + "145, RLW_SRC_TRACK Nonfatal XC0 i0 Link 00 (0x00000007 0x00000004 0x00000000 "
        "0x00000000)",
        "warning",
        "XID_154_EVAL",
        "Non-fatal",
    ),
    (
        _L + "145, RLW_TAGSTATE Nonfatal XC0 i0 Link 00 (0x00000008 0x00000001 0x00000000 "
        "0x00000000)",
        "warning",
        "IGNORE",
        "Non-fatal",
    ),
    (
        _L + "145, RLW_TAGSTATE Fatal XC0 i0 Link 00 (0x00000008 0x00000002 0x00000000 0x00000000)",
        "fatal",
        "RESET_GPU",
        "Fatal",
    ),
    (
        _L + "146, TLW_CTRL Nonfatal XC0 i0 Link 00 (0x00000009 0x00000001 0x00000000 0x00000000)",
        "warning",
        "IGNORE",
        "Non-fatal",
    ),
    (
        _L + "146, TLW_CTRL Fatal XC0 i0 Link 00 (0x00000009 0x00000004 0x00000000 0x00000000)",
        "fatal",
        "RESET_GPU",
        "Fatal",
    ),
    (
        _L + "146, TLW_RX/TLW_RX_PIPE0 Nonfatal XC0 i0 Link 00 (0x0000000a 0x00000001 0x00000000 "
        "0x00000000)",
        "warning",
        "IGNORE",
        "Non-fatal",
    ),
    # GPUd says warning for the four TLW pipe errorStatus 0x4 lines; NVIDIA's sheet says Fatal,
    # RESET_GPU (local Xid 48 and possible packet loss both ends): faultlens follows NVIDIA
    (
        _L + "146, TLW_RX/TLW_RX_PIPE0 Fatal XC0 i0 Link 00 (0x0000000a 0x00000004 0x00000000 "
        "0x00000000)",
        "warning",
        "RESET_GPU",
        "Fatal",
    ),
    (
        _L + "146, TLW_RX/TLW_RX_PIPE1 Nonfatal XC0 i0 Link 00 (0x0000000b 0x00000001 0x00000000 "
        "0x00000000)",
        "warning",
        "IGNORE",
        "Non-fatal",
    ),
    (
        _L + "146, TLW_RX/TLW_RX_PIPE1 Fatal XC0 i0 Link 00 (0x0000000b 0x00000004 0x00000000 "
        "0x00000000)",
        "warning",
        "RESET_GPU",
        "Fatal",
    ),
    (
        _L + "146, TLW_TX/TLW_TX_PIPE0 Nonfatal XC0 i0 Link 00 (0x0000000c 0x00000001 0x00000000 "
        "0x00000000)",
        "warning",
        "IGNORE",
        "Non-fatal",
    ),
    (
        _L + "146, TLW_TX/TLW_TX_PIPE0 Fatal XC0 i0 Link 00 (0x0000000c 0x00000004 0x00000000 "
        "0x00000000)",
        "warning",
        "RESET_GPU",
        "Fatal",
    ),
    (
        _L + "146, TLW_TX/TLW_TX_PIPE1 Nonfatal XC0 i0 Link 00 (0x0000000d 0x00000001 0x00000000 "
        "0x00000000)",
        "warning",
        "IGNORE",
        "Non-fatal",
    ),
    (
        _L + "146, TLW_TX/TLW_TX_PIPE1 Fatal XC0 i0 Link 00 (0x0000000d 0x00000004 0x00000000 "
        "0x00000000)",
        "warning",
        "RESET_GPU",
        "Fatal",
    ),
    (
        _L + "147, TREX Nonfatal XC0 i0 Link 00 (0x0000000e 0x00000001 0x00000000 0x00000000)",
        "warning",
        "IGNORE",
        "Non-fatal",
    ),
    (
        _L + "148, NVLPW_CTRL/NVLPW Nonfatal XC0 i0 Link 00 (0x0000000f 0x80000000 0x00000000 "
        "0x00000000)",
        "warning",
        "IGNORE",
        "Non-fatal",
    ),
    (
        _L + "149, NETIR/NETIR_INT Fatal XC0 i0 Link 00 (0x00000018 0x00000000 0x00000000 "
        "0x00000000)",
        "fatal",
        "RESET_GPU",
        "Link Fatal",
    ),
    (
        _L + "149, NETIR_BER_EVENT Nonfatal XC0 i0 Link 00 (0x00000013 0x00000000 0x00000000 "
        "0x00000000)",
        "warning",
        "IGNORE",
        "Non-fatal",
    ),
    (
        _L + "149, NETIR_BER_EVENT Nonfatal XC0 i0 Link 00 (0x00000013 0x00000001 0x00000000 "
        "0x00000000)",
        "warning",
        "IGNORE",
        "Non-fatal",
    ),
    (
        _L + "149, NETIR_MFDE_EVENT Fatal XC0 i0 Link 00 (0x00000014 0x00000001 0x00000000 "
        "0x00000000)",
        "fatal",
        "RESET_GPU",
        "Fatal**",
    ),
    (
        _L + "149, NETIR_MFDE_EVENT Nonfatal XC0 i0 Link 00 (0x00000014 0x00000003 0x00000000 "
        "0x00000000)",
        "warning",
        "IGNORE",
        "Non-fatal",
    ),
    (
        _L + "149, NETIR_LINK_EVT/NETIR_LINK_DOWN Fatal XC0 i0 Link 00 (0x00000011 0x00000000 "
        "0x00000000 0x00000000)",
        "fatal",
        "RESET_GPU",
        "Link Fatal",
    ),
    (
        _L + "149, NETIR_LINK_EVT/NETIR_LINK_DOWN Fatal XC0 i0 Link 00 (0x01000011 0x00000000 "
        "0x00000000 0x00000000)",
        "fatal",
        "RESET_GPU",
        "Link Fatal",
    ),
    (
        _L + "149, NETIR_LINK_EVT/NETIR_LINK_DOWN Fatal XC0 i0 Link 00 (0x02500011 0x00000000 "
        "0x00000000 0x00000000)",
        "fatal",
        "RESET_GPU",
        "Link Fatal",
    ),
    (
        _L + "150, MSE_WATCHDOG Fatal XC0 i0 Link 00 (0x00000000 0x00000000 0x00000000 0x00000000)",
        "fatal",
        "RESET_GPU",
        "Fatal",
    ),
]


@pytest.mark.parametrize(("line", "gpud", "resolution", "severity"), GPUD_NVLINK5)
def test_gpud_nvlink5_lines_give_nvidias_resolution(catalog, line, gpud, resolution, severity):
    code, message = line.split("): ", 1)[1].split(", ", 1)
    decoded = catalog.decode_nvlink5(int(code), message)
    assert decoded is not None
    assert (decoded.rule.resolution, decoded.rule.severity) == (resolution, severity)
    assert decoded.leave is (XidScope.GPU if resolution == "RESET_GPU" else XidScope.NONE)
    _, events = parse([line], catalog)
    resets = [e for e in events if e.kind == "recovery_action"]
    assert [e.code for e in resets] == ([1] if resolution == "RESET_GPU" else [])
    assert events[0].kind == "xid" and events[0].code == int(code)


def test_reference_netir_line_is_a_link_fatal_reset():
    """The reference's real 149 (intrInfo 0x004525c6, the v1 layout): NETIR_LINK_EVT with
    sub-code 000100 -> RESET_GPU, INVESTIGATE_LINK_SI (NVIDIA's sheet)."""
    catalog = load_xid_catalog()
    decoded = catalog.decode_nvlink5(
        149, "NETIR_LINK_EVT Fatal XC0 i0 Link 09 (0x004525c6 0x00000000 0x0 0x0)"
    )
    assert decoded.rule.resolution == "RESET_GPU"
    assert decoded.rule.investigatory == "INVESTIGATE_LINK_SI"
    assert decoded.rule.severity == "Link Fatal"


def test_nvlink5_line_without_sub_fields_decodes_to_nothing(catalog):
    assert catalog.decode_nvlink5(149, "NETIR_LINK_EVT") is None
    assert catalog.decode_nvlink5(79, "SAW_MVB Fatal XC0 i0 Link 00 (0x1 0x2)") is None
    _, events = parse([_L + "149, something else"], catalog)
    assert kinds(events) == [("xid", 149, "00000000:04:00.0")]


# -- NVSentinel gpufallen_handler_test.go: its fallen-off-the-bus handler answers for the block
# alone and leaves a block with an Xid 79 to its Xid handler; the node's answer is one lost GPU
_NVS_BLOCK = [
    "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0",
    "               NVRM: (PCI ID: 10de:26b5) installed in this system has",
    "               NVRM: fallen off the bus and is not responding to commands.",
]


@pytest.mark.parametrize(
    "lines",
    [
        _NVS_BLOCK,  # "Complete GPU Fallen Error with PCI ID"
        [_NVS_BLOCK[0], "               NVRM: installed in this system has", _NVS_BLOCK[2]],
    ],
)
def test_nvsentinel_fallen_block(lines):
    _, events = parse(lines)
    assert kinds(events) == [("gpu_lost", None, "00000000:B3:00.0")]


@pytest.mark.parametrize(
    "lines",
    [
        # "GPU Fallen Error with XID following": the block, then the driver's Xid 79
        [*_NVS_BLOCK, "NVRM: Xid (PCI:0000:b3:00.0): 79, pid=12345, GPU has fallen off the bus."],
        # "GPU Fallen Error with Xid in middle"
        [_NVS_BLOCK[0], "               NVRM: Xid (PCI:0000:b3:00.0): 79", _NVS_BLOCK[2]],
        # the Xid first, then the block
        ["NVRM: Xid (PCI:0000:b3:00.0): 79, pid=12345, GPU has fallen off the bus.", *_NVS_BLOCK],
        # the single-line form after the Xid, and before it
        [
            "NVRM: Xid (PCI:0000:b3:00): 79, GPU has fallen off the bus.",
            "NVRM: GPU 0000:b3:00.0: GPU has fallen off the bus.",
        ],
        [
            "NVRM: GPU b3:00.0: GPU has fallen off the bus.",
            "NVRM: Xid (PCI:0000:b3:00): 79, GPU has fallen off the bus.",
        ],
    ],
)
def test_one_gpu_loss_is_one_row_whatever_the_order(lines):
    _, events = parse(lines)
    assert [e for e in kinds(events) if e[0] == "gpu_lost"] == [
        ("gpu_lost", None, "00000000:B3:00.0")
    ]
    assert [e for e in kinds(events) if e[0] == "xid"] == [("xid", 79, "00000000:B3:00.0")]


def test_two_gpus_lost_together_stay_two_losses():
    lines = [
        "NVRM: The NVIDIA GPU 0000:b3:00.0",
        "NVRM: fallen off the bus and is not responding.",
        "NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.",
        "NVRM: GPU 18:00.0: GPU has fallen off the bus.",
        "NVRM: Xid (PCI:0000:b3:00): 79, GPU has fallen off the bus.",
    ]
    _, events = parse(lines)
    assert sorted(e[2] for e in kinds(events) if e[0] == "gpu_lost") == [
        "00000000:18:00.0",
        "00000000:B3:00.0",
    ]


# -- the issue's own forms: an Xid whose PCI id is not one, a mangled tail
@pytest.mark.parametrize(
    ("line", "code", "pci", "message"),
    [
        (
            "NVRM: Xid (PCI:0001:ab:cd): 69, pid=2231, name=python, Graphics Exception: "
            "ESR 0x4041b0",
            69,
            None,
            "Graphics Exception: ESR 0x4041b0",
        ),
        ("NVRM: Xid (PCI:0000:01:00): 154 (", 154, "00000000:01:00.0", "("),
        (
            "kernel: NVRM: Xid (PCI:0000:3b:00 ): 48, An uncorrectable double bit error",
            48,
            "00000000:3B:00.0",
            "An uncorrectable double bit error",
        ),
    ],
)
def test_unparseable_xid_keeps_the_event_and_the_raw_line(line, code, pci, message):
    parser, events = parse([line])
    assert (events[0].kind, events[0].code, events[0].pci_bus_id) == ("xid", code, pci)
    assert message in events[0].message
    assert events[0].raw == line
    assert parser.stats.bad_lines == 0


# -- GCM test_check_syslogs.py test_xid: 31 is "non-critical" there, 48 critical
def test_gcm_xid_fixture(catalog):
    lines = [
        "[Fri Oct 14 14:56:49 2022] NVRM: Xid (PCI:000d:00:00): 31, pid=3234, Graphics SM "
        "Warp Exception on (GPC 2, TPC 2, SM 1): Out Of Range Address",
        "[Fri Oct 14 14:56:49 2022] NVRM: Xid (PCI:000d:00:00): 48, pid=3234, Graphics SM "
        "Global Exception on (GPC 2, TPC 2, SM 1): Multiple Warp Errors",
    ]
    _, events = parse(lines)
    assert kinds(events) == [
        ("xid", 31, "0000000D:00:00.0"),
        ("xid", 48, "0000000D:00:00.0"),
        ("ecc_dbe", None, "0000000D:00:00.0"),
    ]
    assert catalog.get(31).leave is XidScope.NONE and not catalog.get(31).hardware
    assert catalog.get(48).leave is XidScope.GPU and catalog.get(48).hardware


def test_an_unreadable_catalog_keeps_the_nvlink5_xid(tmp_path, monkeypatch):
    """A user's xid.yaml that does not load decodes nothing; the Xid line is still an event."""
    from faultlens.collectors.sources import xid_catalog

    (tmp_path / "xid.yaml").write_text("format_version: 1\nxids: [ {code: 13\n")
    monkeypatch.setenv(xid_catalog.XID_CATALOG_ENV, str(tmp_path / "xid.yaml"))
    xid_catalog.shipped_xid_catalog.cache_clear()
    try:
        parser, events = parse([line for line, _, _, _ in GPUD_NVLINK5[:2]])
    finally:
        xid_catalog.shipped_xid_catalog.cache_clear()
    assert [(e.kind, e.code) for e in events] == [("xid", 144), ("xid", 144)]
    assert parser.stats.bad_lines == 0
