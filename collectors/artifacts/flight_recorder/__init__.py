"""Flight-recorder dump reader: a directory of per-rank dumps -> rows of the `collectives` table.

Reads what torch's flight recorder writes (NCCL watchdog files `_dump_9`, `comm_lib_trace_rank_9`)
and what faultlens' trigger writes (`rank_9.pkl`, `rank_9.json`, interface 4): pickle or JSON, NCCL
or gloo, format versions 2.x, one rank or thousands, incomplete sets allowed. The rank is the dump's
top-level `rank` key, else the last integer in the file name; a rank with both a pickle and a JSON
dump is read once, from the pickle (the JSON one is the fallback when the pickle is broken).

Pickles never reach `pickle.load`: a compiled scanner (faultlens.collectors.artifacts.fr_fastpickle)
turns the plain-data opcodes into columns directly, and anything it does not accept goes to the
restricted unpickler (faultlens.collectors.artifacts.safe_pickle), which loads plain data or
refuses. A truncated, corrupt or hostile dump becomes a DumpFileError naming the file and the
problem, and every other rank is still read.

Speed and memory: files are parsed a window at a time by a few threads (the scanner releases the
GIL) and their columns are assembled into Arrow chunks of CHUNK_ROWS rows as they come, with
set-wide string dictionaries, so a 16,384-rank set is never held twice. `columns=` builds only what
a caller needs and `dictionary=True` keeps strings dictionary-encoded, and the sizes and dtypes
lists (inputs and outputs) as codes of set-wide dictionaries of their values (shapes.py: a job
repeats a few hundred distinct values on millions of entries), which is what the hang analysis
uses; such a read also keeps each dictionary's indices as narrow as its size allows (int8/int16)
and record_id, p2p_seq_id, op_id, timeout_ms as int32 in a chunk whose values fit: 42 bytes a row
for the analysis' columns, where plain lists and strings took 93. The defaults give the table
exactly in the schema.

Rows, one per entry (`record_id` set). Besides them each dump adds one *status row* per `pg_status`
group (`record_id` null; `pg_id` the dump's local id, `pg_last_enqueued/started/completed` set), or
a single status row when it has none, so a dump with no entries (an idle rank in an only-active
dump) is still visible as present.

Process groups: `pg_id` is the rank-local id of the entry; `pg_name` / `pg_desc` come from
`process_group` and are what identifies a group across ranks. `pg_ranks` (global ranks of the group)
comes from `pg_config`; when that is broken as gloo writes it (keyed '', ranks '[]', groups
overwriting each other) it is rebuilt from the entries: the ranks whose dumps recorded that group
(plus every rank of `world_size`, else 0..highest rank read, for the default group). To keep dump
sets of thousands of ranks small, `pg_ranks` is carried on the first row of each group (per distinct
membership) in the set, and is null on the group's other rows: `SELECT DISTINCT pg_name, pg_ranks
... WHERE pg_ranks IS NOT NULL`.

The modules, in reading order: model (the table, errors, DumpSet, a dump as columns), values (checks
shared by both parsers), objects (the reference parser, from Python objects), fastpath (the compiled
scanner's tape into columns), files (which files are dumps; one file into a dump), arrow and groups
(set-wide dictionaries, Arrow pieces, process-group facts), memory (set-sized arrays outside numpy's
allocator), assembly and chunks (dumps written into the chunk's column buffers, Arrow chunks and the
set's table), shapes (the dictionaries of list values of a dictionary read), parts (a range of files
per reader, the merge of readers' parts) and read (read_dump_dir, read_dump_file). The constants
exported here are read by the modules that use them (FAST_PATH_MIN_BYTES by read, CHUNK_ROWS by
parts): patch them there.
"""

from __future__ import annotations

import logging

from faultlens.collectors.artifacts.flight_recorder.files import (
    find_dump_files,
    load_dump_bytes,
    rank_from_name,
)
from faultlens.collectors.artifacts.flight_recorder.groups import parse_ranks
from faultlens.collectors.artifacts.flight_recorder.model import (
    CHUNK_ROWS,
    DEFAULT_MAX_FRAMES,
    JSON_SUFFIXES,
    PICKLE_SUFFIXES,
    SCHEMA,
    TABLE,
    DumpDirError,
    DumpFileError,
    DumpSet,
)
from faultlens.collectors.artifacts.flight_recorder.parts import (
    PROCESS_MIN_FILES,
    auto_processes,
    merged_name,
)
from faultlens.collectors.artifacts.flight_recorder.read import (
    FAST_PATH_MIN_BYTES,
    read_dump_dir,
    read_dump_file,
)

log = logging.getLogger(__name__)

__all__ = [
    "CHUNK_ROWS",
    "DEFAULT_MAX_FRAMES",
    "FAST_PATH_MIN_BYTES",
    "JSON_SUFFIXES",
    "PICKLE_SUFFIXES",
    "PROCESS_MIN_FILES",
    "SCHEMA",
    "TABLE",
    "DumpDirError",
    "DumpFileError",
    "DumpSet",
    "auto_processes",
    "find_dump_files",
    "load_dump_bytes",
    "merged_name",
    "parse_ranks",
    "rank_from_name",
    "read_dump_dir",
    "read_dump_file",
]
