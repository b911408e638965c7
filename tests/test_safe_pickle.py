"""The restricted unpickler: plain data loads, anything that would import, call or build code is
refused and nothing runs (the file a payload would create is not created)."""

from __future__ import annotations

import collections
import copyreg
import pickle
import struct
from pathlib import Path

import pytest

from faultlens.collectors.artifacts.safe_pickle import (
    PickleLoadError,
    UnsafePickleError,
    safe_load,
    safe_loads,
)
from tests.conftest import DATA_DIR


def _unicode(text: str) -> bytes:
    raw = text.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw


def _short_unicode(text: str) -> bytes:
    raw = text.encode()
    return b"\x8c" + bytes([len(raw)]) + raw


def _payloads(target: Path) -> dict[str, bytes]:
    cmd = f"touch {target}"
    cmd_text = f"S'{cmd}'\n".encode()
    return {
        # protocol 0: GLOBAL os.system, then REDUCE with a tuple of the command
        "global_reduce_os_system": b"cos\nsystem\n(" + cmd_text + b"tR.",
        "global_reduce_posix_system": b"\x80\x02cposix\nsystem\nq\x00" + _unicode(cmd) + b"\x85R.",
        # protocol 4: STACK_GLOBAL from two strings, then REDUCE
        "stack_global_reduce": b"\x80\x04"
        + _short_unicode("os")
        + _short_unicode("system")
        + b"\x93"
        + _short_unicode(cmd)
        + b"\x85R.",
        # INST: mark, args, then 'i module\nname\n' calls it
        "inst": b"(" + cmd_text + b"ios\nsystem\n.",
        # OBJ: mark, class/callable, args, 'o'
        "obj": b"(cos\nsystem\n" + cmd_text + b"o.",
        # builtins.eval / exec / getattr chains
        "global_eval": b'c__builtin__\neval\n(S\'__import__("os").system("'
        + cmd.encode()
        + b"\")'\ntR.",
        "global_exec": b"\x80\x02cbuiltins\nexec\n"
        + _unicode(f"import os; os.system({cmd!r})")
        + b"\x85R.",
        "getattr_chain": b"\x80\x02cbuiltins\ngetattr\ncos\n"
        + _unicode("system")
        + b"\x86R"
        + _unicode(cmd)
        + b"\x85R.",
        # NEWOBJ of a non-builtin class (constructing any object is refused, even a harmless one)
        "newobj_ordereddict": b"\x80\x02ccollections\nOrderedDict\n)\x81.",
        "newobj_popen": b"\x80\x02csubprocess\nPopen\n]"
        + _unicode("touch")
        + b"a"
        + _unicode(str(target))
        + b"a\x85\x81.",
        # NEWOBJ_EX (protocol 4)
        "newobj_ex": b"\x80\x04"
        + _short_unicode("collections")
        + _short_unicode("OrderedDict")
        + b"\x93)}\x92.",
        # NEWOBJ on an admitted name still needs a type: the helpers are functions, so it is refused
        "newobj_admitted_set": b"\x80\x02c__builtin__\nset\n)\x81.",
        # BUILD on a builtin container (would set attributes / call __setstate__)
        "build_on_dict": b"\x80\x02}}" + _unicode("x") + b"K\x01sb.",
        "build_on_list": b"\x80\x02]}" + _unicode("__class__") + b"K\x01sb.",
        # persistent ids
        "persid": b"P" + cmd.encode() + b"\n.",
        "binpersid": b"\x80\x02" + _unicode(cmd) + b"Q.",
        # admitted helpers used outside their one job
        "bytes_bomb": b"\x80\x02c__builtin__\nbytes\nJ\x00\x00\x00\x40\x85R.",
        "codecs_other_encoding": b"\x80\x02c_codecs\nencode\n"
        + _unicode("x")
        + _unicode("zlib_codec")
        + b"\x86R.",
        # a whole pickled object of a user class
        "pickled_user_object": pickle.dumps(collections.Counter(a=1), protocol=2),
        "pickled_user_object_p5": pickle.dumps(collections.OrderedDict(a=1), protocol=5),
    }


@pytest.mark.parametrize("name", sorted(_payloads(Path("/nonexistent")).keys()))
def test_malicious_pickle_is_refused_and_nothing_runs(name: str, tmp_path: Path) -> None:
    target = tmp_path / "pwned"
    payload = _payloads(target)[name]
    # the payloads are real: some of them run when loaded with plain pickle (checked for os.system
    # below)
    with pytest.raises(UnsafePickleError) as info:
        safe_loads(payload, source=f"dump-{name}.pkl")
    assert f"dump-{name}.pkl" in str(info.value)
    assert not target.exists()


def test_the_os_system_payload_really_runs_under_plain_pickle(tmp_path: Path) -> None:
    """The control: the same bytes do execute with pickle.loads, so the refusal above is meaningful.
    """
    target = tmp_path / "pwned"
    pickle.loads(_payloads(target)["global_reduce_os_system"])
    assert target.exists()


def test_extension_registry_goes_through_the_same_refusal(tmp_path: Path) -> None:
    target = tmp_path / "pwned"
    code = 0x7FFFF0
    copyreg.add_extension("os", "system", code)
    try:
        payload = (
            b"\x80\x02\x84" + struct.pack("<i", code) + _unicode(f"touch {target}") + b"\x85R."
        )
        with pytest.raises(UnsafePickleError):
            safe_loads(payload, source="ext.pkl")
    finally:
        copyreg.remove_extension("os", "system", code)
    assert not target.exists()


@pytest.mark.parametrize("protocol", [0, 1, 2, 3, 4, 5])
def test_plain_builtin_data_loads_in_every_protocol(protocol: int) -> None:
    value = {
        "version": "2.10",
        "entries": [
            {"a": 1, "b": [[2, 3]], "c": None, "d": True, "e": 1.5, "f": ("0", "default_pg")}
        ],
        "big": 2**70,
        "neg": -(2**40),
        "set": {1, 2},
        "frozen": frozenset({"x"}),
        "bytes": b"\x00\xffab",
        "empty_bytes": b"",
        "nested": [[[]], {}, ()],
    }
    assert safe_loads(pickle.dumps(value, protocol=protocol)) == value


def test_truncated_and_garbage_pickles_name_the_source() -> None:
    good = pickle.dumps({"entries": list(range(100))}, protocol=2)
    with pytest.raises(PickleLoadError, match=r"rank_3\.pkl.*truncated"):
        safe_loads(good[: len(good) // 2], source="rank_3.pkl")
    with pytest.raises(PickleLoadError, match=r"rank_4\.pkl"):
        safe_loads(b"this is not a pickle at all", source="rank_4.pkl")
    with pytest.raises(PickleLoadError, match=r"empty\.pkl"):
        safe_loads(b"", source="empty.pkl")


def test_real_nccl_dump_loads(tmp_path: Path) -> None:
    dump = safe_load(DATA_DIR / "nccl-fr-gpu_error_2nd" / "_dump_9")
    assert dump["version"] == "2.9"
    assert len(dump["entries"]) == 20
    assert dump["entries"][0]["process_group"] == ("37", "TENSOR_MODEL_PARALLEL_GROUP")


def test_unreadable_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(PickleLoadError, match=r"missing\.pkl"):
        safe_load(tmp_path / "missing.pkl")
