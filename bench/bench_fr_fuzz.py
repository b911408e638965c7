"""Fuzzing the flight-recorder dump readers: crashes, tracebacks, disagreements, memory and time per
KB.

    # 100,000 inputs per reader (pickle: both paths; JSON)
    python -m bench.bench_fr_fuzz
    python -m bench.bench_fr_fuzz --n 2000 --json        # what the CI runs (tests/test_fr_fuzz.py)
    # every key-name fetch retargeted (~209,000 inputs)
    python -m bench.bench_fr_fuzz --readers pickle-keys

Seeds are real dumps: the public NCCL set (tests/data/nccl-fr-gpu_error_2nd, 16 ranks) and real gloo
dumps from torchrun jobs (tests/data/gloo-fr-*, pickle and JSON). Each input is a mutant of a seed
(one or a few changed bytes, inserted or deleted bytes, truncation, splices of two seeds,
opcode-aware edits that set a length, memo index or integer to an extreme, opcode swaps) or a
generated hostile dump (shared references, nesting, huge integers and dims, surrogates, unhashable
keys, sets and bytes, world sizes and ranks beyond a job's, BUILD and globals). Every pickle goes
through both readers, the compiled scanner (`fast_path=True`) and the restricted unpickler
(`fast_path=False`).

Accepted dumps are assembled into an Arrow table (the named hostile inputs and every 8th mutant: it
is the slowest step). Counted: crashes (the worker process dies: it runs in a subprocess, restarted
after the input that killed it), tracebacks (any exception other than the reader's one-line
DumpFileError, or an error message of more than one line or without the file name), disagreements
(one reader accepts what the other refuses, or both accept with different columns), peak RSS (the
worker's, after the real seeds vs at the end), worst-case time per KB of input.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import pickletools
import random
import resource
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

DATA = REPO_ROOT / "tests" / "data"
SEED_DIRS = (DATA / "nccl-fr-gpu_error_2nd", DATA / "gloo-fr-hang", DATA / "gloo-fr-straggler")


# --------------------------------------------------------------------------------------------------
# seeds


def seeds() -> tuple[list[bytes], list[bytes]]:
    """(pickle seeds, JSON seeds): real dumps."""
    pickles, jsons = [], []
    for directory in SEED_DIRS:
        for path in sorted(directory.iterdir()):
            if path.name.startswith(("LICENSE", ".")) or path.suffix in (".md", ".txt", ".log"):
                continue
            data = path.read_bytes()
            (jsons if path.suffix == ".json" else pickles).append(data)
    return pickles, jsons


def _ops(data: bytes) -> list[tuple[int, str]]:
    try:
        return [(pos, op.name) for op, _arg, pos in pickletools.genops(data)]
    except Exception:
        return []


# --------------------------------------------------------------------------------------------------
# generated hostile dumps


def _entry(i: int, **fields: Any) -> dict[str, Any]:
    base = {
        "record_id": i,
        "pg_id": 0,
        "process_group": ("0", "default_pg"),
        "collective_seq_id": i,
        "p2p_seq_id": 0,
        "op_id": i,
        "profiling_name": "nccl:all_reduce",
        "time_created_ns": 10**18 + i,
        "input_sizes": [[4, 4]],
        "input_dtypes": ["Float"],
        "output_sizes": [[4, 4]],
        "output_dtypes": ["Float"],
        "state": "scheduled",
        "time_discovered_started_ns": None,
        "time_discovered_completed_ns": None,
        "retired": False,
        "timeout_ms": 600000,
        "is_p2p": False,
    }
    base.update(fields)
    return base


def _top(entries: list[Any], **fields: Any) -> dict[str, Any]:
    top = {
        "version": "2.9",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
        "pg_status": {
            "0": {
                "last_enqueued_collective": 1,
                "last_started_collective": -1,
                "last_completed_collective": -1,
            }
        },
        "entries": entries,
    }
    top.update(fields)
    return top


def _laughs(depth: int, width: int, leaf: Any = 1) -> Any:
    value: Any = [leaf] * width
    for _ in range(depth):
        value = [value] * width
    return value


def _nest(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


def _u(text: str) -> bytes:
    raw = text.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw


def _raw_top(pairs: bytes) -> bytes:
    """A protocol-2 dump {'version': '2.9', 'entries': [], <pairs>} written opcode by opcode (for
    shapes the pickler cannot write: nesting deeper than its recursion limit, shared tuples as
    keys)."""
    return b"\x80\x02}(" + _u("version") + _u("2.9") + _u("entries") + b"]" + pairs + b"u."


def _raw_nest(depth: int) -> bytes:
    return b"]" * depth + b"a" * (depth - 1)


def _raw_tuple_laughs(depth: int) -> bytes:
    """A tuple of two references to a tuple of two references to ... (depth levels, memo indices
    0..depth).
    """
    out = _u("x") + _u("y") + b"\x86q\x00"
    for level in range(depth):
        out += b"0h" + bytes([level]) + b"h" + bytes([level]) + b"\x86q" + bytes([level + 1])
    return out


def hostile_pickles() -> dict[str, bytes]:
    """Named attacks and breakages (the cases of issue 16 among them); tests use them too."""
    shape = [7] * 1000
    sizes = [shape] * 100
    frames = [{"name": "f", "filename": "x.py", "line": 1}] * 1000
    shared_entry = _entry(0)
    out = {
        "binunicode8_wrap": b"\x80\x02}q\x00(X\x07\x00\x00\x00entries]\x8d"
        + struct.pack("<Q", 2**63 - 16)
        + b"abcdefghu.",
        "binbytes8_wrap": b"\x80\x02}q\x00(X\x07\x00\x00\x00entries]\x8e"
        + struct.pack("<Q", 2**63 - 16)
        + b"abcdefghu.",
        "long_binput_huge": b"\x80\x02)r\xff\xff\xff\x7f.",
        "put_text_huge": b"(lp99999999999\n.",
        "shared_sizes": pickle.dumps(
            _top([_entry(i, input_sizes=sizes) for i in range(200)]), protocol=2
        ),
        "shared_frames": pickle.dumps(
            _top([_entry(i, frames=frames) for i in range(500)]), protocol=2
        ),
        "shared_dtypes": pickle.dumps(
            _top(
                [_entry(i, input_dtypes=["Float"] * 1 + ["x"] * 0) for i in range(10)]
                + [_entry(99, input_dtypes=["Float"] * 50000)] * 400
            ),
            protocol=2,
        ),
        "dup_entries": b"\x80\x02}(X\x07\x00\x00\x00version"
        + b"X\x03\x00\x00\x002.9"
        + b"X\x07\x00\x00\x00entries"
        + b"]("
        + pickle.dumps(shared_entry, protocol=2)[2:-1]
        + b"2" * 200000
        + b"eu.",
        "billion_laughs_version": pickle.dumps(_top([], version=_laughs(30, 2)), protocol=2),
        "billion_laughs_node": pickle.dumps(_top([_entry(0)], node=_laughs(30, 2)), protocol=2),
        "billion_laughs_pg": pickle.dumps(
            _top([_entry(0, process_group=(_laughs(30, 2), "x"))]), protocol=2
        ),
        "tuple_laughs_status_key": _raw_top(_u("pg_status") + b"}" + _raw_tuple_laughs(40) + b"}s"),
        "tuple_laughs_dict_key": _raw_top(_u("x") + b"}" + _raw_tuple_laughs(60) + b"Ns"),
        "tuple_laughs_in_set": b"\x80\x02c__builtin__\nset\n]" + _raw_tuple_laughs(40) + b"a\x85R.",
        "deep_nesting_field": _raw_top(_u("extra") + _raw_nest(100000)),
        "deep_nesting_node": _raw_top(_u("node") + _raw_nest(5000)),
        "int_5000_digit_string": pickle.dumps(
            _top([_entry(0, collective_seq_id="1" * 5000)]), protocol=2
        ),
        "int_huge_long4": pickle.dumps(_top([_entry(0, op_id=1 << 40000)]), protocol=2),
        "dim_2_63": pickle.dumps(_top([_entry(0, input_sizes=[[2**63]])]), protocol=2),
        "dim_2_64_neg": pickle.dumps(_top([_entry(0, input_sizes=[[-(2**64)]])]), protocol=2),
        "rank_2_31": pickle.dumps(_top([_entry(0)], rank=2**31), protocol=2),
        "rank_huge": pickle.dumps(_top([_entry(0)], rank=10**30), protocol=2),
        "world_size_1e7": pickle.dumps(_top([_entry(0)], world_size=10**7, rank=0), protocol=2),
        "pg_ranks_2e9": pickle.dumps(
            _top(
                [_entry(0)],
                pg_config={"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 2000000000]"}},
            ),
            protocol=2,
        ),
        "pg_ranks_deep": pickle.dumps(
            _top(
                [_entry(0)],
                pg_config={"0": {"name": "0", "desc": "default_pg", "ranks": "[" * 100000}},
            ),
            protocol=2,
        ),
        "surrogate_string": b"\x80\x02}(X\x07\x00\x00\x00versionX\x03\x00\x00\x00\xed\xa0\x80"
        b"X\x07\x00\x00\x00entries]u.",
        "invalid_utf8_string": b"\x80\x02}(X\x07\x00\x00\x00versionX\x01\x00\x00\x00\xff"
        b"X\x07\x00\x00\x00entries]u.",
        "list_key": b"\x80\x02}(]X\x01\x00\x00\x00aX\x07\x00\x00\x00entries]u.",
        "build_defaults": b"\x80\x02c__builtin__\nset\nN}X\x0c\x00\x00\x00__defaults__"
        b"(X\x08\x00\x00\x00POLLUTEDtsb.",
        "return_function": b"\x80\x02c__builtin__\nset\n.",
        "global_os_system": b"cos\nsystem\n(S'true'\ntR.",
        "frame_line_2_62": pickle.dumps(
            _top(
                [
                    _entry(
                        0,
                        frames=[
                            {"name": "a", "filename": "b", "line": 2**62},
                            {"name": "a", "filename": "b", "line": 1},
                        ],
                    )
                ]
            ),
            protocol=2,
        ),
        "proto_255": b"\x80\xff}X\x07\x00\x00\x00entries]s.",
        "pop_mark": b"\x80\x02}(X\x07\x00\x00\x00entries]0u.",
        "stop_only": b".",
        "empty": b"",
    }
    return out


def hostile_jsons() -> dict[str, bytes]:
    good = {"version": "2.10", "pg_config": {}, "pg_status": {}, "entries": [_entry(0)], "rank": 0}
    return {
        "nested_50000": b'{"version": "2.10", "entries": [], "x": '
        + b"[" * 50000
        + b"]" * 50000
        + b"}",
        "world_size_1e7": json.dumps({**good, "world_size": 10**7}).encode(),
        "rank_2e9": json.dumps({**good, "rank": 2 * 10**9}).encode(),
        "int_5000_digits": b'{"version": "2.10", "entries": [], "rank": ' + b"1" * 5000 + b"}",
        "seq_5000_digit_string": json.dumps(
            {**good, "entries": [_entry(0, collective_seq_id="7" * 5000)]}
        ).encode(),
        "float_1e999": b'{"version": "2.10", "entries": [], "world_size": 1e999}',
        "dim_2_63": json.dumps({**good, "entries": [_entry(0, input_sizes=[[2**63]])]}).encode(),
        "surrogate": b'{"version": "2.10", "entries": [], "node": "\\ud800"}',
        "entries_not_list": b'{"version": "2.10", "entries": {}}',
        "top_list": b"[1, 2, 3]",
        "truncated": json.dumps(good).encode()[:-7],
        "pg_ranks_deep": json.dumps(
            {**good, "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[" * 100000}}}
        ).encode(),
    }


# --------------------------------------------------------------------------------------------------
# mutators

_EXTREMES_4 = (0x7FFFFFFF, 0xFFFFFFFF, 0x80000000, 0, 1, 0x01000000)
_EXTREMES_8 = (2**63 - 16, 2**63 - 1, 2**64 - 1, 2**62, 2**32, 0)


def mutate_pickle(
    rng: random.Random, pickles: list[bytes], ops: list[list[tuple[int, str]]]
) -> bytes:
    index = rng.randrange(len(pickles))
    data = bytearray(pickles[index])
    roll = rng.random()
    if roll < 0.45:  # one byte
        data[rng.randrange(len(data))] = rng.randrange(256)
    elif roll < 0.55:  # a few bytes
        for _ in range(rng.randint(2, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
    elif roll < 0.62:  # insert / delete
        at = rng.randrange(len(data))
        if rng.random() < 0.5:
            data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        else:
            del data[at:at + rng.randint(1, 16)]
    elif roll < 0.66:  # truncate
        data = data[: rng.randrange(len(data))]
    elif roll < 0.72:  # splice two seeds
        other = pickles[rng.randrange(len(pickles))]
        data = data[: rng.randrange(len(data))] + other[rng.randrange(len(other)):]
    elif roll < 0.92 and ops[index]:  # opcode-aware: an argument to an extreme, or another opcode
        pos, name = ops[index][rng.randrange(len(ops[index]))]
        choice = rng.random()
        if choice < 0.3:
            data[pos] = rng.choice(
                b"XBCJKMqrhj\x8a\x8b\x8c\x8d\x8e\x94()]}ateslud0122\x85\x86\x87NR.b"
            )
        elif name in ("BINUNICODE", "BINBYTES", "LONG_BINPUT", "LONG_BINGET", "BININT", "LONG4"):
            data[pos + 1:pos + 5] = struct.pack("<I", rng.choice(_EXTREMES_4))
        elif name in ("BINGET", "BINPUT", "SHORT_BINUNICODE", "BININT1", "LONG1"):
            data[pos + 1] = rng.choice((0, 1, 8, 9, 16, 255))
        else:
            data[pos:pos + 1] = bytes([0x8D]) + struct.pack("<Q", rng.choice(_EXTREMES_8))
    else:  # generated
        data = bytearray(generated_pickle(rng))
    return bytes(data)


def generated_pickle(rng: random.Random) -> bytes:
    """A dump with random hostile structure (shared references, odd types, extreme values)."""
    n = rng.randint(0, 50)
    shape = [rng.choice((1, 7, 2**31, 2**63 - 1, -1))] * rng.choice((1, 10, 1000))
    shared = [shape] * rng.choice((1, 10, 300))
    choices = [
        lambda i: _entry(i),
        lambda i: _entry(i, input_sizes=shared),
        lambda i: _entry(
            i,
            frames=[
                {
                    "name": rng.choice(("a", None, 5, "é")),
                    "filename": "f.py",
                    "line": rng.choice((1, -1, None, 2**40, True)),
                }
            ]
            * rng.choice((1, 20)),
        ),
        lambda i: _entry(
            i, process_group=rng.choice((("a", "b"), ["a"], (), None, (1, 2), ("a", "b", "c")))
        ),
        lambda i: _entry(
            i, collective_seq_id=rng.choice(("12", "x", 1.0, 1.5, None, True, 2**64, [1]))
        ),
        lambda i: _entry(
            i, input_dtypes=rng.choice((["Float"], "Float", [1], None, ("a", "b"), {"a": 1}))
        ),
        lambda i: _entry(i, is_p2p=rng.choice((True, 0, "yes", None, [1]))),
        lambda i: _entry(i, state=rng.choice(("scheduled", 5, None, b"x", ["a"]))),
        lambda i: {"record_id": i, "set": {1, 2}, "bytes": b"\x00\xff", "fs": frozenset([1])},
        lambda i: rng.choice((1, "x", None, [1])),
    ]
    entries = [rng.choice(choices)(i) for i in range(n)]
    fields: dict[str, Any] = {}
    if rng.random() < 0.3:
        fields["rank"] = rng.choice((0, 3, -1, 2**31, 10**7, "5", "x", 1.0))
    if rng.random() < 0.3:
        fields["world_size"] = rng.choice((4, 0, -4, 10**7, 2**20, "16"))
    if rng.random() < 0.2:
        fields["version"] = rng.choice(("2.10", "3.0", 2.9, None, ["2.9"], "2." + "9" * 50))
    if rng.random() < 0.2:
        fields["node"] = rng.choice(("n", 5, None, ["n"], _nest(rng.choice((10, 200)))))
    if rng.random() < 0.2:
        fields["pg_status"] = rng.choice(
            (
                {},
                {"0": "x"},
                {"0": {"last_enqueued_collective": "4"}},
                {(1, 2): {}},
                {
                    0: {
                        "last_enqueued_collective": 1,
                        "last_started_collective": 1,
                        "last_completed_collective": 1,
                    }
                },
            )
        )
    data = pickle.dumps(_top(entries, **fields), protocol=rng.choice((2, 2, 2, 0, 1, 3, 4, 5)))
    return data


def mutate_json(rng: random.Random, jsons: list[bytes]) -> bytes:
    data = bytearray(jsons[rng.randrange(len(jsons))])
    roll = rng.random()
    if roll < 0.5:
        data[rng.randrange(len(data))] = (
            rng.randrange(32, 127) if rng.random() < 0.8 else rng.randrange(256)
        )
    elif roll < 0.6:
        for _ in range(rng.randint(2, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
    elif roll < 0.65:
        data = data[: rng.randrange(len(data))]
    elif roll < 0.85:  # a value replaced by an extreme one
        extremes = (
            b"1" * 5000,
            b"1e999",
            b"-1e999",
            b"9223372036854775808",
            b"10000000",
            b"2000000000",
            b"[" * 20000 + b"]" * 20000,
            b'"\\ud800"',
            b'"' + b"7" * 30 + b'"',
            b"null",
            b"{}",
            b"[]",
            b"-1",
            b"1.5",
            b'"x"',
        )
        digits = [i for i, c in enumerate(data) if 0x30 <= c <= 0x39]
        if digits:
            at = rng.choice(digits)
            end = at
            while end < len(data) and 0x30 <= data[end] <= 0x39:
                end += 1
            data[at:end] = rng.choice(extremes)
    else:
        top = {
            "version": rng.choice(("2.10", "2.9", 2.10, "4.0")),
            "entries": [],
            "pg_config": {},
            "pg_status": {},
        }
        if rng.random() < 0.5:
            top["world_size"] = rng.choice((4, 10**7, -1, "4"))
        if rng.random() < 0.5:
            top["rank"] = rng.choice((0, 2**31, -3, "1", None))
        top["entries"] = [
            _entry(i, input_sizes=rng.choice(([[4]], [[2**63]], [["4"]], [[None]], "x")))
            for i in range(rng.randint(0, 5))
        ]
        data = bytearray(json.dumps(top).encode())
    return bytes(data)


def _key_gets(
    data: bytes, keys: frozenset[str]
) -> tuple[list[tuple[int, str, int]], dict[int, str]]:
    """(BINGET / LONG_BINGET opcodes that fetch a memoized key name: (position, opcode, memo
    index)), and the memo indices of key names."""
    memo: dict[int, str] = {}
    gets: list[tuple[int, str, int]] = []
    last: str | None = None
    try:
        for op, arg, pos in pickletools.genops(data):
            if op.name in ("BINUNICODE", "SHORT_BINUNICODE", "UNICODE", "BINUNICODE8"):
                last = arg
                continue
            if op.name in ("BINPUT", "LONG_BINPUT", "PUT", "MEMOIZE") and last is not None:
                memo[len(memo) if op.name == "MEMOIZE" else int(arg)] = last
            elif op.name in ("BINGET", "LONG_BINGET") and memo.get(arg) in keys:
                gets.append((pos, op.name, int(arg)))
            last = None
    except Exception:
        return [], {}
    return gets, {index: text for index, text in memo.items() if text in keys}


def _key_swap_edits(data: bytes) -> list[tuple[int, str, int]]:
    from faultlens.collectors.artifacts.fr_fastpickle import ENTRY_KEYS

    gets, names = _key_gets(data, frozenset(ENTRY_KEYS))
    return [(pos, name, other) for pos, name, index in gets for other in sorted(names)
            if other != index and (name == "LONG_BINGET" or other <= 255)]


def _apply_swap(data: bytes, edit: tuple[int, str, int]) -> bytes:
    pos, name, other = edit
    mutant = bytearray(data)
    if name == "BINGET":
        mutant[pos + 1] = other
    else:
        mutant[pos + 1:pos + 5] = struct.pack("<I", other)
    return bytes(mutant)


def key_swaps(data: bytes) -> list[bytes]:
    """Every dump in which one fetch of a memoized key name fetches another key name instead: one
    dict then holds a key twice and lacks another (the shape of input 26,083 of seed 1: a pg_status
    group with 'last_completed_collective' twice and no 'last_enqueued_collective'), or gains a key
    it should not have."""
    return [_apply_swap(data, edit) for edit in _key_swap_edits(data)]


def key_swap_stream(seed: int) -> Any:
    """The key-swap mutants of every pickle seed (~209,000), in a shuffled order of the seed."""
    pickles, _ = seeds()
    edits = [_key_swap_edits(data) for data in pickles]
    order = [(i, j) for i, seed_edits in enumerate(edits) for j in range(len(seed_edits))]
    random.Random(seed).shuffle(order)
    for i, j in order:
        yield _apply_swap(pickles[i], edits[i][j])


# --------------------------------------------------------------------------------------------------
# one input


def digest(dump: Any) -> list[Any]:
    """What reaches the rows, comparable between the two readers."""
    from faultlens.collectors.artifacts.flight_recorder.groups import config_ranks, status_value

    out: list[Any] = [
        dump.rank,
        dump.n,
        dump.version,
        dump.world_size,
        dump.node,
        dump.comm_lib_version,
    ]
    for key, (values, valid) in sorted(dump.ints.items()):
        out += [key, values[valid].tobytes(), valid.tobytes()]
    out += [dump.pg_id[0][dump.pg_id[1]].tobytes(), dump.pg_id[1].tobytes(), dump.is_p2p.tobytes(),
            dump.retired.tobytes()]
    for key, column in sorted(dump.strings.items()):
        out += [key, [column.values[i] if i >= 0 else None for i in column.codes.tolist()]]
    for key, sizes in sorted(dump.sizes.items()):
        out += [
            key,
            sizes.counts.tobytes(),
            sizes.ndims.astype("int64").tobytes(),
            sizes.dims.tobytes(),
        ]
    for key, column in sorted(dump.dtypes.items()):
        out += [key, column.counts.tobytes(), [column.values[i] for i in column.items.tolist()]]
    if dump.frames is not None:
        out += [
            dump.frames.counts.tobytes(),
            [dump.frames.values[i] for i in dump.frames.items.tolist()],
        ]
    out.append(sorted((str(k), config_ranks(dump.pg_config, k))
                      for k in dump.pg_config if isinstance(k, str)))
    keys = ("last_enqueued_collective", "last_started_collective", "last_completed_collective")
    out.append(sorted((str(k), [status_value(dump.pg_status, str(k), x) for x in keys])
                      for k in dump.pg_status))
    return out


def _one(data: bytes, name: str, fast: bool, assemble: bool) -> tuple[str, Any, float]:
    from faultlens.collectors.artifacts.flight_recorder import DumpFileError, load_dump_bytes
    from faultlens.collectors.artifacts.flight_recorder.assembly import Assembly
    from faultlens.collectors.store.schema import TABLES

    started = time.perf_counter()
    try:
        dump = load_dump_bytes(data, name, fast_path=fast)
        result = ("ok", digest(dump))
        if assemble:
            assembly = Assembly(columns=set(TABLES["collectives"].names), dictionary=False)
            assembly.add(dump, f"fuzz/{name}")
            assembly.table(None)
    except DumpFileError as exc:
        message = str(exc)
        if "\n" in message or name not in message:
            result = ("traceback", f"bad error message: {message[:300]!r}")
        else:
            result = ("err", message)
    except BaseException as exc:  # counting exactly these is the point
        result = ("traceback", f"{type(exc).__name__}: {str(exc)[:300]}")
    return result[0], result[1], time.perf_counter() - started


def check(data: bytes, reader: str, assemble: bool = True) -> dict[str, Any]:
    """One input through the reader(s): {'outcome': ok|err, 'traceback': text|None, 'disagree':
    bool, 'times'}.
    assemble: also build the accepted dump into an Arrow table (the reference reader's)."""
    if reader == "json":
        kind, value, seconds = _one(data, "rank_0.json", False, assemble)
        return {
            "outcome": kind,
            "traceback": value if kind == "traceback" else None,
            "disagree": False,
            "times": [seconds],
            "message": value if kind == "err" else None,
        }
    fast = _one(data, "rank_0.pkl", True, False)
    ref = _one(data, "rank_0.pkl", False, assemble)
    tb = next((r[1] for r in (fast, ref) if r[0] == "traceback"), None)
    disagree = fast[0] != ref[0] or (fast[0] == "ok" and fast[1] != ref[1])
    return {"outcome": ref[0], "traceback": tb, "disagree": disagree, "times": [fast[2], ref[2]],
            "message": ref[1] if ref[0] == "err" else None, "fast": fast[0]}


# --------------------------------------------------------------------------------------------------
# worker and driver


def _inputs(reader: str, seed: int) -> Any:
    """Deterministic stream of inputs: the named hostile cases first, then mutants."""
    pickles, jsons = seeds()
    # one key name fetched for another (a key twice in a dict, another absent)
    if reader == "pickle-keys":
        yield from key_swap_stream(seed)
        return
    if reader == "json":
        yield from hostile_jsons().values()
        rng = random.Random(seed)
        while True:
            yield mutate_json(rng, jsons)
    else:
        yield from hostile_pickles().values()
        ops = [_ops(p) for p in pickles]
        rng = random.Random(seed)
        while True:
            yield mutate_pickle(rng, pickles, ops)


def worker(reader: str, seed: int, start: int, count: int) -> None:
    """Runs inputs start..start+count-1, printing `I <index>` before each and one `R <json>` at the
    end.
    """
    pickles, jsons = seeds()
    real = jsons if reader == "json" else pickles
    real_per_kb = 0.0
    # the real inputs: RSS and time per KB baselines (twice, the first warms the scanner)
    for data in real:
        check(data, reader)
    for data in real:
        result = check(data, reader)
        real_per_kb = max(real_per_kb, max(result["times"]) / max(len(data), 1) * 1024)
    rss_real = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    stats: dict[str, Any] = {
        "inputs": 0,
        "accepted": 0,
        "refused": 0,
        "tracebacks": 0,
        "disagreements": 0,
        "worst_s_per_kb": 0.0,
        "worst_s": 0.0,
        "real_worst_s_per_kb": real_per_kb,
        "rss_real_mb": rss_real,
        "examples": [],
        "fast_accepted": 0,
    }
    stream = _inputs(reader, seed)
    for index, data in enumerate(stream):
        if index >= start + count:
            break
        if index < start:
            continue
        sys.stdout.write(f"I {index}\n")
        sys.stdout.flush()
        # every named hostile input and every 8th mutant is also assembled into a table (the slowest
        # step)
        result = check(data, reader, assemble=index < 64 or index % 8 == 0)
        stats["inputs"] += 1
        stats["accepted" if result["outcome"] == "ok" else "refused"] += 1
        stats["fast_accepted"] += int(result.get("fast") == "ok")
        if result["traceback"]:
            stats["tracebacks"] += 1
        if result["disagree"]:
            stats["disagreements"] += 1
        if (result["traceback"] or result["disagree"]) and len(stats["examples"]) < 10:
            stats["examples"].append({"index": index, "traceback": result["traceback"],
                                      "disagree": result["disagree"], "hex": data[:200].hex()})
        worst = max(result["times"])
        stats["worst_s"] = max(stats["worst_s"], worst)
        stats["worst_s_per_kb"] = max(stats["worst_s_per_kb"], worst / max(len(data), 256) * 1024)
        if stats["inputs"] % 2000 == 0:  # what a run cut short by its time limit still reports
            stats["rss_peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            sys.stdout.write("P " + json.dumps(stats) + "\n")
            sys.stdout.flush()
    stats["rss_peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    sys.stdout.write("R " + json.dumps(stats) + "\n")
    sys.stdout.flush()


def run(reader: str, n: int, seed: int = 1, timeout_s: float = 1800) -> dict[str, Any]:
    """n inputs through `reader` ('pickle' or 'json') in worker subprocesses; a worker that dies is
    a crash.
    """
    total: dict[str, Any] = {
        "reader": reader,
        "inputs": 0,
        "accepted": 0,
        "refused": 0,
        "tracebacks": 0,
        "disagreements": 0,
        "crashes": 0,
        "crash_inputs": [],
        "worst_s_per_kb": 0.0,
        "worst_s": 0.0,
        "real_worst_s_per_kb": 0.0,
        "rss_real_mb": 0.0,
        "rss_peak_mb": 0.0,
        "examples": [],
        "fast_accepted": 0,
    }
    started = time.perf_counter()
    start = 0
    env = dict(
        os.environ, PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
    )
    while start < n:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.bench_fr_fuzz",
                "--worker",
                "--reader",
                reader,
                "--seed",
                str(seed),
                "--start",
                str(start),
                "--n",
                str(n - start),
            ],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        last = start - 1
        result = partial = None
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("I "):
                last = int(line[2:])
            elif line.startswith("R "):
                result = json.loads(line[2:])
            elif line.startswith("P "):
                partial = json.loads(line[2:])
            if time.perf_counter() - started > timeout_s:
                proc.kill()
                # the inputs of the last progress line, counted
                if result is None and partial is not None:
                    result = partial
                    total["timed_out"] = True
                break
        code = proc.wait()
        if result is not None:
            for key in (
                "inputs",
                "accepted",
                "refused",
                "tracebacks",
                "disagreements",
                "fast_accepted",
            ):
                total[key] += result[key]
            for key in (
                "worst_s_per_kb",
                "worst_s",
                "real_worst_s_per_kb",
                "rss_real_mb",
                "rss_peak_mb",
            ):
                total[key] = max(total[key], result[key])
            total["examples"] += result["examples"][: 10 - len(total["examples"])]
            break
        if time.perf_counter() - started > timeout_s:
            total["timed_out"] = True
            break
        # the worker died on input `last` (or before the first input: then it is broken, stop)
        if last < start:
            total["worker_failed"] = code
            break
        total["crashes"] += 1
        total["inputs"] += last - start + 1
        total["crash_inputs"].append({"index": last, "exit": code})
        start = last + 1
    total["seconds"] = round(time.perf_counter() - started, 1)
    total["rss_ratio"] = (
        round(total["rss_peak_mb"] / total["rss_real_mb"], 2) if total["rss_real_mb"] else None
    )
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--n", type=int, default=100_000, help="inputs per reader (default 100,000)"
    )
    parser.add_argument("--readers", default="pickle,json")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout-s", type=float, default=1800,
                        help="per reader: stop then and report the inputs counted so far "
                             "(timed_out: true)")
    parser.add_argument("--json", action="store_true", help="print only the JSON result")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--reader", default="pickle", help=argparse.SUPPRESS)
    parser.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.reader, args.seed, args.start, args.n)
        return 0
    results = [run(reader, args.n, args.seed, args.timeout_s) for reader in args.readers.split(",")]
    if args.json:
        print(json.dumps(results, indent=1))
        return 0
    from bench.common import emit, machine

    emit("fr_fuzz", {"machine": machine(), "results": results})
    print("\n| reader | inputs | accepted | crashes | tracebacks | disagreements | peak RSS (x "
          "real) | "
          "worst s/KB (real) | worst input s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        name = {"pickle": "pickle (scanner + restricted unpickler)", "json": "JSON",
                "pickle-keys": "pickle key swaps (both readers)"}[r["reader"]]
        print(f"| {name} | {r['inputs']:,} | {r['accepted']:,} | {r['crashes']} | "
              f"{r['tracebacks']} | "
              f"{r['disagreements']} | {r['rss_peak_mb']:.0f} MB ({r['rss_ratio']}x) | "
              f"{r['worst_s_per_kb'] * 1000:.2f} ms ({r['real_worst_s_per_kb'] * 1000:.2f} ms) | "
              f"{r['worst_s']:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
