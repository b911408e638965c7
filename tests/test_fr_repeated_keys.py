"""A dict of a dump that holds a key twice (and so, in a dump of fixed shape, lacks another) reads
the same through both pickle readers: the compiled scanner and the restricted unpickler accept it
with the same columns, or both refuse it with a one-line DumpFileError naming the file.

Found by the fuzz bench (input 26,083 of seed 1, a one-byte mutant of a real NCCL dump: one BINGET
fetched the memoized 'last_completed_collective' where 'last_enqueued_collective' had been): the
scanner counted three known keys in the pg_status group and read the absent one as -1, the reference
(the last of a repeated key wins, the absent one is None) as unknown. The family: every dict the
readers look into (pg_status groups, pg_config groups, the top level, entries, frames), a key
repeated with the same or another type, before or after the others. Run in a subprocess, as the
other scanner tests: a scanner crash fails the test instead of killing pytest."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_CHECK = textwrap.dedent(r'''
    import json, random, struct, sys
    from bench.bench_fr_fuzz import _apply_swap, _key_gets, _key_swap_edits, _one, seeds
    from faultlens.collectors.artifacts.fr_fastpickle import ENTRY_KEYS


    class D:  # a dict written pair by pair: repeated keys stay repeated in the pickle
        def __init__(self, *pairs):
            self.pairs = pairs


    def enc(v):
        if isinstance(v, D):
            return b"}(" + b"".join(enc(k) + enc(x) for k, x in v.pairs) + b"u"
        if isinstance(v, str):
            raw = v.encode()
            return b"X" + struct.pack("<I", len(raw)) + raw
        if v is None:
            return b"N"
        if isinstance(v, bool):
            return b"\x88" if v else b"\x89"
        if isinstance(v, int):
            return b"J" + struct.pack("<i", v)
        if isinstance(v, (list, tuple)):
            body = b"(" + b"".join(enc(x) for x in v)
            return (b"]" + body + b"e") if isinstance(v, list) else (body + b"t")
        raise TypeError(v)


    def dump(status=None, config=None, top=(), entry=(), frame=None):
        group = (
            status
            if status is not None
            else D(
                ("last_enqueued_collective", 3),
                ("last_started_collective", 2),
                ("last_completed_collective", 1),
            )
        )
        cfg = (
            config
            if config is not None
            else D(("name", "0"), ("desc", "default_pg"), ("ranks", "[0, 1]"))
        )
        fr = frame if frame is not None else D(("name", "f"), ("filename", "x.py"), ("line", 7))
        ent = D(
            ("record_id", 0),
            ("pg_id", 0),
            ("process_group", ("0", "default_pg")),
            ("collective_seq_id", 1),
            ("op_id", 1),
            ("profiling_name", "nccl:all_reduce"),
            ("time_created_ns", 5),
            ("input_sizes", [[4]]),
            ("input_dtypes", ["Float"]),
            ("state", "scheduled"),
            ("frames", [fr]),
            *entry,
        )
        pairs = [
            ("version", "2.9"),
            ("pg_config", D(("0", cfg))),
            ("pg_status", D(("0", group))),
            ("entries", [ent]),
            *top,
        ]
        return b"\x80\x02" + enc(D(*pairs)) + b"."


    L = ("last_enqueued_collective", "last_started_collective", "last_completed_collective")
    cases = {}
    for missing in L:  # one of the three absent, another twice (both orders), as in the fuzz input
        for twice in L:
            if twice != missing:
                pairs = [(k, 10 + i) for i, k in enumerate(L) if k != missing] + [(twice, 20)]
                cases[f"status {twice} twice, {missing} absent"] = dump(status=D(*pairs))
                cases[f"status {twice} twice first, {missing} absent"] = dump(
                    status=D(*pairs[::-1])
                )
    cases["status all three, one twice"] = dump(status=D(*[(k, 1) for k in L], (L[0], 9)))
    cases["status str then int"] = dump(status=D((L[0], "x"), *[(k, 1) for k in L]))
    cases["status int then str"] = dump(status=D(*[(k, 1) for k in L], (L[1], "x")))
    cases["status one key three times"] = dump(status=D((L[2], 1), (L[2], 2), (L[2], 3)))
    cases["status group twice"] = (
        b"\x80\x02"
        + enc(
            D(
                ("version", "2.9"),
                ("entries", []),
                ("pg_status", D(("0", D(*[(k, 1) for k in L])), ("0", D((L[0], 5))))),
            )
        )
        + b"."
    )
    cases["config ranks twice"] = dump(
        config=D(("name", "0"), ("ranks", "[0, 1, 2]"), ("ranks", "[0, 1]"))
    )
    cases["config name for desc"] = dump(
        config=D(("name", "0"), ("name", "x"), ("ranks", "[0, 1]"))
    )
    cases["config ranks int then str"] = dump(
        config=D(("name", "0"), ("ranks", 5), ("ranks", "[0, 1]"))
    )
    cases["top pg_status twice"] = dump(top=[("pg_status", D(("0", D((L[0], 7)))))])
    cases["top rank twice"] = dump(top=[("rank", 1), ("rank", 2)])
    cases["top entries twice"] = dump(top=[("entries", [])])
    cases["top version twice"] = dump(top=[("version", "9.9")])
    cases["entry state twice"] = dump(entry=[("state", "completed")])
    cases["entry record_id twice"] = dump(entry=[("record_id", 4)])
    cases["entry op_id str then int"] = dump(entry=[("op_id", "x"), ("op_id", 3)])
    cases["frame line twice"] = dump(
        frame=D(("name", "f"), ("line", 1), ("filename", "x.py"), ("line", 2))
    )
    cases["frame name for filename"] = dump(frame=D(("name", "f"), ("name", "g"), ("line", 1)))
    cases["frame line str then int"] = dump(
        frame=D(("name", "f"), ("filename", "x"), ("line", "x"), ("line", 3))
    )

    # every key-name fetch of real dumps retargeted: exhaustively in the small dicts (pg_status,
    # pg_config keys), a sample of the rest
    pickles, _ = seeds()
    small = {
        "last_enqueued_collective",
        "last_started_collective",
        "last_completed_collective",
        "name",
        "desc",
        "ranks",
        "pg_status",
        "pg_config",
        "version",
        "rank",
    }
    rng = random.Random(16)
    for s, data in enumerate(
        (pickles[0], pickles[-1], pickles[-5])
    ):  # NCCL, gloo straggler, gloo hang
        edits = _key_swap_edits(data)
        gets, names = _key_gets(data, frozenset(ENTRY_KEYS))
        fetched = {pos: names[index] for pos, _n, index in gets}
        chosen = [e for e in edits if fetched[e[0]] in small and names[e[2]] in small]
        rest = [e for e in edits if e not in chosen]
        chosen += rng.sample(rest, min(len(rest), 150))
        for e in chosen:
            cases[f"seed {s} swap at {e[0]} to {names[e[2]]}"] = _apply_swap(data, e)

    bad = []
    accepted = 0
    for label, data in cases.items():
        fast = _one(data, "rank_0.pkl", True, False)
        ref = _one(data, "rank_0.pkl", False, False)
        if (
            "traceback" in (fast[0], ref[0])
            or fast[0] != ref[0]
            or (fast[0] == "ok" and fast[1] != ref[1])
        ):
            bad.append(
                [
                    label,
                    fast[0],
                    ref[0],
                    str(fast[1])[:200] if fast[0] != "ok" else None,
                    str(ref[1])[:200] if ref[0] != "ok" else None,
                ]
            )
        accepted += fast[0] == "ok"
    print(
        json.dumps(
            {
                "cases": len(cases),
                "accepted": accepted,
                "disagree": bad[:20],
                "disagreements": len(bad),
            }
        )
    )
''')


def test_both_pickle_readers_agree_on_dicts_with_a_key_twice() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _CHECK], cwd=REPO, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-3000:]}"
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["cases"] > 300
    assert 0 < result["accepted"] < result["cases"]  # readable and broken dumps both among them
    assert result["disagreements"] == 0, result["disagree"]
