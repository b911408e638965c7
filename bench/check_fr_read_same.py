"""The flight-recorder reader's output, old code against new: the same tables (Table.equals: schema,
dictionaries, indices, values), the same ranks, files and per-file errors, on synthetic and real
dump sets.

    PYTHONPATH=. python bench/check_fr_read_same.py --old /tmp/baseline

--old is a checkout of the old code (e.g. `git archive main | tar -x -C /tmp/baseline`). Each
checkout reads every (set, options) case in its own subprocess (`faultlens` resolves to that
checkout) and writes the tables as Arrow IPC files; this process compares them. Sets: the 4,096-rank
set of bench_hang (if generated; read the way the hang bench reads it), a 256-rank slice of it with
every column, tests/data/nccl-fr-gpu_error_2nd, and each set of the gloo hang corpus
(tests/torch_jobs/hang_corpus; its pickles and its JSON form), with every column and with the hang
columns, fast and reference paths. Exit status 1 on any difference. A list column one side keeps as
a dictionary of its values (input_sizes and input_dtypes in a dictionary read, from 2026-12-03 on)
is compared decoded, its strings plain on both sides.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

REPO_ROOT = Path(__file__).resolve().parents[1]
BIG_SET = REPO_ROOT / "bench" / "out" / "fr-dumps" / "ranks4096-entries2000-v2"

_CHILD = r"""
import json, sys
from pathlib import Path
import pyarrow as pa, pyarrow.ipc as ipc
from faultlens.collectors.artifacts.flight_recorder import read_dump_dir
from faultlens.attribution.detectors.hang import COLUMNS

cases, out = json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2])
for i, case in enumerate(cases):
    options = dict(case["options"])
    if options.pop("hang_columns", False):
        options["columns"] = COLUMNS
    dumps = read_dump_dir(case["dir"], **options)
    with ipc.new_file(out / f"{i}.arrow", dumps.table.schema) as writer:
        writer.write_table(dumps.table)
    meta = {
        "ranks": list(dumps.ranks),
        "files": list(dumps.files),
        "errors": [str(e) for e in dumps.errors],
        "world_size": dumps.world_size,
        "skipped": list(dumps.skipped),
    }
    (out / f"{i}.json").write_text(json.dumps(meta))
"""

_FULL = (
    {},
    {"fast_path": True},
    {"fast_path": False},
    {"dictionary": True, "fast_path": True},
    {"hang_columns": True, "dictionary": True, "max_frames": 0, "fast_path": True},
    {"hang_columns": True, "dictionary": True, "max_frames": 0, "fast_path": True, "workers": 1},
)


def cases(slice_dir: Path) -> list[dict]:
    sys.path.insert(0, str(REPO_ROOT))
    from tests.torch_jobs.hang_corpus.generate import corpus

    dirs = [REPO_ROOT / "tests" / "data" / "nccl-fr-gpu_error_2nd"]
    for _name, root in sorted(corpus().items()):
        dirs += [Path(root) / "dumps", Path(root) / "dumps-json"]
    out = [{"dir": str(d), "options": o} for d in dirs if d.is_dir() for o in _FULL]
    if BIG_SET.is_dir():
        for i in range(256):
            (slice_dir / f"_dump_{i}").symlink_to(BIG_SET / f"_dump_{i}")
        out += [{"dir": str(slice_dir), "options": o} for o in _FULL]
        out.append(
            {
                "dir": str(BIG_SET),
                "options": {"hang_columns": True, "dictionary": True, "max_frames": 0},
            }
        )
    return out


def _comparable(tables: list[pa.Table]) -> list[pa.Table]:
    """The tables as compared. Where one side keeps a list column as a dictionary of its values and
    the other as lists (input_sizes and input_dtypes in a dictionary read, from 2026-12-03 on), both
    sides' columns are decoded first (list<dictionary<string>> as list<string>): their rows must be
    the same lists."""
    old, new = tables
    for name in old.column_names:
        if name not in new.column_names or old.schema.field(name).type.equals(
            new.schema.field(name).type
        ):
            continue
        for side in (0, 1):
            table = tables[side]
            field = table.schema.field(name)
            column = table.column(name)
            if pa.types.is_dictionary(field.type) and pa.types.is_list(field.type.value_type):
                column = pa.chunked_array(
                    [c.dictionary_decode() for c in column.chunks], field.type.value_type
                )
            if pa.types.is_list(column.type) and pa.types.is_dictionary(column.type.value_type):
                column = column.cast(pa.list_(column.type.value_type.value_type))
            tables[side] = table.set_column(
                table.schema.get_field_index(name), field.with_type(column.type), column
            )
    return tables


def read_all(root: Path, case_file: Path, out: Path) -> None:
    out.mkdir()
    env = dict(os.environ, PYTHONPATH=str(root.resolve()))
    subprocess.run(
        [sys.executable, "-c", _CHILD, str(case_file), str(out)], env=env, cwd=root, check=True
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--old", type=Path, required=True, help="checkout of the old code")
    parser.add_argument("--new", type=Path, default=REPO_ROOT, help="checkout of the new code "
                                                                    "(default: this one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "slice").mkdir()
        todo = cases(work / "slice")
        case_file = work / "cases.json"
        case_file.write_text(json.dumps(todo))
        read_all(args.old, case_file, work / "old")
        read_all(args.new, case_file, work / "new")
        bad = 0
        for i, case in enumerate(todo):
            tables = _comparable(
                [ipc.open_file(work / side / f"{i}.arrow").read_all() for side in ("old", "new")]
            )
            metas = [json.loads((work / side / f"{i}.json").read_text()) for side in ("old", "new")]
            same = (
                tables[0].equals(tables[1])
                and tables[0].schema.equals(tables[1].schema, check_metadata=True)
                and metas[0] == metas[1]
            )
            bad += not same
            print(
                "same" if same else "DIFFERENT",
                tables[0].num_rows,
                case["dir"],
                case["options"],
                flush=True,
            )
            del tables
        print(f"{len(todo) - bad}/{len(todo)} cases the same")
        sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
