"""A compiled, data-only scanner for flight-recorder pickles: entries straight into column arrays.

``pickle.load`` of a 2,000-entry dump builds ~100,000 Python objects, and turning them into rows
builds as many again; at 16,384 ranks that is minutes. This scanner (numba, no GIL) walks the pickle
opcodes once and writes what the collectives table needs into NumPy arrays, without creating Python
objects for entries.

Safety: it understands only the opcodes that spell plain data (containers, strings, bytes, ints,
floats, bools, None, the memo). Any other opcode (GLOBAL, STACK_GLOBAL, REDUCE, BUILD, INST, OBJ,
NEWOBJ, EXT*, PERSID, text protocol-0 forms, sets), any value it cannot hold (an int wider than 64
bits, a memo index out of range), and any truncation or inconsistency makes it return a non-zero
status, and the caller hands the file to the restricted unpickler
(faultlens.collectors.artifacts.safe_pickle), which loads it or refuses it with the error a user
sees. Nothing here calls code named by the pickle.

Layout: pass 1 builds a "tape": node kind, value or string offset/length, and each container's
children as runs of a child array (a container filled by one APPENDS/SETITEMS/TUPLE is one run; a
long list appended in batches is a chain of runs), so memoized containers shared through BINGET stay
one node. Pass 2 reads the fields of every entry dict under the top-level 'entries' key, and the
top-level fields, pg_config and pg_status, into arrays. Workspace arrays are reused across files by
each thread (allocating them per file costs more than parsing). numba did not inline helper
functions taking arrays here (each call paid reference counting), so the hot loops are written out
by hand.
"""

# ruff: noqa: SIM109  (explicit == chains keep the numba hot loop free of tuple membership tests)
from __future__ import annotations

import numpy as np
from numba import njit

OK = 0
UNSUPPORTED = 1  # an opcode outside plain data: let the restricted unpickler decide (and refuse)
CORRUPT = 2  # truncated or inconsistent: let the restricted unpickler produce the error message
NOT_A_DUMP = 3  # well-formed plain data, but not a dict with an 'entries' list of dicts
# more than the output arrays or the element budget hold: the restricted path applies the limits
LIMIT = 4

# Contract with the restricted unpickler (the reference): the scanner returns OK only for input that
# the reference loads to the same value; everything else (any doubt) is declined with a non-zero
# status and the reference decides. So both readers accept and refuse exactly the same files. Every
# read of `buf` is preceded by a bounds check written without overflow (`length > n - pos`), and
# every write to a workspace array by a capacity check.

K_NONE, K_FALSE, K_TRUE, K_INT, K_FLOAT, K_STR, K_BYTES, K_LIST, K_DICT, K_TUPLE = range(10)

ENTRY_KEYS = (
    "record_id",
    "pg_id",
    "process_group",
    "collective_seq_id",
    "p2p_seq_id",
    "op_id",
    "profiling_name",
    "time_created_ns",
    "input_sizes",
    "input_dtypes",
    "output_sizes",
    "output_dtypes",
    "state",
    "time_discovered_started_ns",
    "time_discovered_completed_ns",
    "retired",
    "timeout_ms",
    "is_p2p",
    "frames",
    "name",
    "filename",
    "line",
    "entries",
    # top level, pg_config and pg_status (read by _top)
    "version",
    "pg_config",
    "pg_status",
    "rank",
    "world_size",
    "node",
    "comm_lib_version",
    "nccl_version",
    "desc",
    "ranks",
    "last_enqueued_collective",
    "last_started_collective",
    "last_completed_collective",
)
TOP_FIELDS = (
    "version",
    "pg_config",
    "pg_status",
    "rank",
    "world_size",
    "node",
    "comm_lib_version",
    "nccl_version",
)
# int fields of an entry, in the order of the `ints` output rows
INT_FIELDS = ("record_id", "pg_id", "collective_seq_id", "p2p_seq_id", "op_id", "time_created_ns",
              "time_discovered_started_ns", "time_discovered_completed_ns", "timeout_ms")
_INT_SLOT = {ENTRY_KEYS.index(name): slot for slot, name in enumerate(INT_FIELDS)}
_KEY_ENTRIES = ENTRY_KEYS.index("entries")


def _key_table() -> tuple[np.ndarray, np.ndarray]:
    raw = [k.encode() for k in ENTRY_KEYS]
    offsets = np.zeros(len(raw) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(r) for r in raw])
    return np.frombuffer(b"".join(raw), dtype=np.uint8).copy(), offsets


KEY_BYTES, KEY_OFFSETS = _key_table()
INT_SLOT_OF_KEY = np.full(len(ENTRY_KEYS), -1, dtype=np.int64)
for _key, _slot in _INT_SLOT.items():
    INT_SLOT_OF_KEY[_key] = _slot


@njit(cache=True, nogil=True)
def _u32(buf, pos):
    return (np.int64(buf[pos]) | (np.int64(buf[pos + 1]) << 8) | (np.int64(buf[pos + 2]) << 16)
            | (np.int64(buf[pos + 3]) << 24))


@njit(cache=True, nogil=True)
def _tape(
    buf,
    kind,
    ival,
    ilen,
    eparent,
    echild,
    stack,
    marks,
    memo,
    head,
    tail,
    run_start,
    run_end,
    run_next,
    max_string,
):
    """Pass 1 into workspace arrays (capacity >= len(buf) + 2; memo and head all -1, and left all -1
    but for the heads of this tape's nodes, which the caller resets after reading them). Returns
    (status, root, kind, ival, ilen, n_nodes, eparent, echild, n_edges, n_runs)."""
    status, root, nn, ne, memo_hi, nr = _tape_inner(
        buf,
        kind,
        ival,
        ilen,
        eparent,
        echild,
        stack,
        marks,
        memo,
        head,
        tail,
        run_start,
        run_end,
        run_next,
        max_string,
    )
    for i in range(memo_hi + 1):
        memo[i] = -1
    return status, root, kind, ival, ilen, nn, eparent, echild, ne, nr


@njit(cache=True, nogil=True)
def _tape_inner(
    buf,
    kind,
    ival,
    ilen,
    eparent,
    echild,
    stack,
    marks,
    memo,
    head,
    tail,
    run_start,
    run_end,
    run_next,
    max_string,
):
    n = buf.shape[0]
    cap = kind.shape[0]
    if (
        n + 2 > cap
        or echild.shape[0] < cap
        or stack.shape[0] < cap
        or marks.shape[0] < cap
        or memo.shape[0] < cap
        or head.shape[0] < cap
        or tail.shape[0] < cap
        or run_start.shape[0] < cap
        or run_end.shape[0] < cap
        or run_next.shape[0] < cap
        or ival.shape[0] < cap
        or ilen.shape[0] < cap
    ):
        return LIMIT, -1, 0, 0, -1, 0
    frame_end = -1
    nr = 0
    memo_cap = memo.shape[0]
    memo_len = 0
    memo_hi = -1
    nn = 0
    ne = 0
    sp = 0
    mp = 0
    # stack items below the last MARK cannot be popped (kept as MARKs are pushed and popped)
    fence = 0
    pos = 0
    root = -1
    while pos < n:
        # (every opcode pushes at most one stack item, node, child or run, so n + 2 entries always
        # suffice)
        if frame_end >= 0:  # inside a FRAME: an opcode straddling its end is left to the reference
            if pos > frame_end:
                return UNSUPPORTED, pos, nn, ne, memo_hi, nr
            if pos == frame_end:
                frame_end = -1
        op = buf[pos]
        pos += 1
        if op == 0x68 or op == 0x6A:  # BINGET h, LONG_BINGET j
            if op == 0x68:
                if n - pos < 1:
                    return CORRUPT, pos, nn, ne, memo_hi, nr
                idx = np.int64(buf[pos])
                pos += 1
            else:
                if n - pos < 4:
                    return CORRUPT, pos, nn, ne, memo_hi, nr
                idx = _u32(buf, pos)
                pos += 4
            if idx >= memo_cap or memo[idx] < 0:
                return CORRUPT, pos, nn, ne, memo_hi, nr
            stack[sp] = memo[idx]
            sp += 1
        elif op == 0x71 or op == 0x72 or op == 0x94:  # BINPUT q, LONG_BINPUT r, MEMOIZE
            if sp <= fence:
                return UNSUPPORTED, pos, nn, ne, memo_hi, nr
            if op == 0x71:
                if n - pos < 1:
                    return CORRUPT, pos, nn, ne, memo_hi, nr
                idx = np.int64(buf[pos])
                pos += 1
            elif op == 0x72:
                if n - pos < 4:
                    return CORRUPT, pos, nn, ne, memo_hi, nr
                idx = _u32(buf, pos)
                pos += 4
            else:
                idx = np.int64(memo_len)
            # the reference bounds a memo index by the size
            if idx >= memo_cap or (op == 0x72 and idx >= n):
                return UNSUPPORTED, pos, nn, ne, memo_hi, nr
            if memo[idx] < 0:
                memo_len += 1
            if idx > memo_hi:
                memo_hi = idx
            memo[idx] = stack[sp - 1]
        elif op == 0x80:  # PROTO
            if pos >= n:
                return CORRUPT, pos, nn, ne, memo_hi, nr
            if buf[pos] > 5:
                return UNSUPPORTED, pos, nn, ne, memo_hi, nr
            pos += 1
        elif op == 0x95:  # FRAME
            if frame_end >= 0 or n - pos < 8:
                return UNSUPPORTED, pos, nn, ne, memo_hi, nr
            length = _u32(buf, pos) | (_u32(buf, pos + 4) << 32)
            pos += 8
            if length < 0 or length > n - pos:
                return UNSUPPORTED, pos, nn, ne, memo_hi, nr
            frame_end = pos + length
        elif op == 0x7D or op == 0x5D or op == 0x29:  # EMPTY_DICT } EMPTY_LIST ] EMPTY_TUPLE )
            kind[nn] = K_DICT if op == 0x7D else (K_LIST if op == 0x5D else K_TUPLE)
            ival[nn] = 0
            ilen[nn] = 0
            stack[sp] = nn
            sp += 1
            nn += 1
        elif op == 0x28:  # MARK
            marks[mp] = sp
            mp += 1
            fence = sp
        elif op == 0x58 or op == 0x8C or op == 0x8D or op == 0x42 or op == 0x43 or op == 0x8E:
            # BINUNICODE X, SHORT_BINUNICODE, BINUNICODE8, BINBYTES B, SHORT_BINBYTES C, BINBYTES8
            if op == 0x8C or op == 0x43:
                if n - pos < 1:
                    return CORRUPT, pos, nn, ne, memo_hi, nr
                length = np.int64(buf[pos])
                pos += 1
            elif op == 0x58 or op == 0x42:
                if n - pos < 4:
                    return CORRUPT, pos, nn, ne, memo_hi, nr
                length = _u32(buf, pos)
                pos += 4
            else:
                if n - pos < 8:
                    return CORRUPT, pos, nn, ne, memo_hi, nr
                length = _u32(buf, pos) | (_u32(buf, pos + 4) << 32)
                pos += 8
            # compared without forming pos + length (a length near 2^63 would wrap)
            if length < 0 or length > n - pos:
                return CORRUPT, pos, nn, ne, memo_hi, nr
            if length > max_string:
                return LIMIT, pos, nn, ne, memo_hi, nr
            is_str = op == 0x58 or op == 0x8C or op == 0x8D
            if is_str:
                # strict UTF-8 (no overlong forms, no surrogates, at most U+10FFFF), as the
                # reference requires
                i = pos
                end = pos + length
                while i < end:
                    c = buf[i]
                    if c < 0x80:
                        i += 1
                        continue
                    if c < 0xC2 or c > 0xF4:
                        return UNSUPPORTED, pos, nn, ne, memo_hi, nr
                    if c < 0xE0:
                        need = 1
                    elif c < 0xF0:
                        need = 2
                    else:
                        need = 3
                    if need > end - i - 1:
                        return UNSUPPORTED, pos, nn, ne, memo_hi, nr
                    c1 = buf[i + 1]
                    if (c1 & 0xC0) != 0x80:
                        return UNSUPPORTED, pos, nn, ne, memo_hi, nr
                    if (
                        (c == 0xE0 and c1 < 0xA0)
                        or (c == 0xED and c1 >= 0xA0)
                        or (c == 0xF0 and c1 < 0x90)
                        or (c == 0xF4 and c1 >= 0x90)
                    ):
                        return UNSUPPORTED, pos, nn, ne, memo_hi, nr
                    for k in range(2, need + 1):
                        if (buf[i + k] & 0xC0) != 0x80:
                            return UNSUPPORTED, pos, nn, ne, memo_hi, nr
                    i += need + 1
            kind[nn] = K_STR if is_str else K_BYTES
            ival[nn] = pos
            ilen[nn] = length
            pos += length
            stack[sp] = nn
            sp += 1
            nn += 1
        elif op == 0x4B or op == 0x4D or op == 0x4A:  # BININT1 K, BININT2 M, BININT J
            if op == 0x4B:
                if n - pos < 1:
                    return CORRUPT, pos, nn, ne, memo_hi, nr
                value = np.int64(buf[pos])
                pos += 1
            elif op == 0x4D:
                if n - pos < 2:
                    return CORRUPT, pos, nn, ne, memo_hi, nr
                value = np.int64(buf[pos]) | (np.int64(buf[pos + 1]) << 8)
                pos += 2
            else:
                if n - pos < 4:
                    return CORRUPT, pos, nn, ne, memo_hi, nr
                value = _u32(buf, pos)
                if value >= 2147483648:
                    value -= 4294967296
                pos += 4
            kind[nn] = K_INT
            ival[nn] = value
            ilen[nn] = 0
            stack[sp] = nn
            sp += 1
            nn += 1
        elif op == 0x8A or op == 0x8B:  # LONG1, LONG4
            if op == 0x8A:
                if n - pos < 1:
                    return CORRUPT, pos, nn, ne, memo_hi, nr
                length = np.int64(buf[pos])
                pos += 1
            else:
                if n - pos < 4:
                    return CORRUPT, pos, nn, ne, memo_hi, nr
                length = _u32(buf, pos)
                pos += 4
            if length > 8:
                return UNSUPPORTED, pos, nn, ne, memo_hi, nr
            if length > n - pos:
                return CORRUPT, pos, nn, ne, memo_hi, nr
            value = np.int64(0)
            for i in range(length):
                value |= np.int64(buf[pos + i]) << (8 * i)
            if 0 < length < 8 and buf[pos + length - 1] >= 0x80:
                value -= np.int64(1) << (8 * length)
            pos += length
            kind[nn] = K_INT
            ival[nn] = value
            ilen[nn] = 0
            stack[sp] = nn
            sp += 1
            nn += 1
        elif op == 0x47:  # BINFLOAT (big-endian double): keep the raw bits
            if n - pos < 8:
                return CORRUPT, pos, nn, ne, memo_hi, nr
            bits = np.int64(0)
            for i in range(8):
                bits = (bits << 8) | np.int64(buf[pos + i])
            pos += 8
            kind[nn] = K_FLOAT
            ival[nn] = bits
            ilen[nn] = 0
            stack[sp] = nn
            sp += 1
            nn += 1
        elif op == 0x4E or op == 0x88 or op == 0x89:  # NONE, NEWTRUE, NEWFALSE
            kind[nn] = K_NONE if op == 0x4E else (K_TRUE if op == 0x88 else K_FALSE)
            ival[nn] = 0 if op != 0x88 else 1
            ilen[nn] = 0
            stack[sp] = nn
            sp += 1
            nn += 1
        elif op == 0x61:  # APPEND a
            if sp - 2 < fence or sp < 2 or kind[stack[sp - 2]] != K_LIST:
                return CORRUPT, pos, nn, ne, memo_hi, nr
            echild[ne] = stack[sp - 1]
            # children echild[ne:ne + 1] of stack[sp - 2]: extend its last run when contiguous, else
            # link a new run
            _target = stack[sp - 2]
            _t = tail[_target]
            if head[_target] >= 0 and run_end[_t] == ne:
                run_end[_t] = ne + 1
            else:
                run_start[nr] = ne
                run_end[nr] = ne + 1
                run_next[nr] = -1
                if head[_target] < 0:
                    head[_target] = nr
                else:
                    run_next[_t] = nr
                tail[_target] = nr
                nr += 1
            ilen[_target] += ne + 1 - (ne)
            ne += 1
            sp -= 1
        elif op == 0x65 or op == 0x75:  # APPENDS e, SETITEMS u
            if mp == 0:
                return CORRUPT, pos, nn, ne, memo_hi, nr
            mp -= 1
            fence = marks[mp - 1] if mp > 0 else 0
            start = marks[mp]
            if start < 1 or start > sp:
                return CORRUPT, pos, nn, ne, memo_hi, nr
            # the target is below the enclosing MARK
            if start - 1 < (marks[mp - 1] if mp > 0 else 0):
                return UNSUPPORTED, pos, nn, ne, memo_hi, nr
            target = stack[start - 1]
            if op == 0x65 and kind[target] != K_LIST:
                return CORRUPT, pos, nn, ne, memo_hi, nr
            if op == 0x75 and (kind[target] != K_DICT or (sp - start) % 2 != 0):
                return CORRUPT, pos, nn, ne, memo_hi, nr
            if op == 0x75:
                for i in range(start, sp, 2):
                    kk = kind[stack[i]]
                    # unhashable or odd keys
                    if kk == K_LIST or kk == K_DICT or kk == K_TUPLE or kk == K_FLOAT:
                        return UNSUPPORTED, pos, nn, ne, memo_hi, nr
            first = ne
            for i in range(start, sp):
                echild[ne] = stack[i]
                ne += 1
            if ne > first:
                # children echild[first:ne] of target: extend its last run when contiguous, else
                # link a new run
                _target = target
                _t = tail[_target]
                if head[_target] >= 0 and run_end[_t] == first:
                    run_end[_t] = ne
                else:
                    run_start[nr] = first
                    run_end[nr] = ne
                    run_next[nr] = -1
                    if head[_target] < 0:
                        head[_target] = nr
                    else:
                        run_next[_t] = nr
                    tail[_target] = nr
                    nr += 1
                ilen[_target] += ne - (first)
            sp = start
        elif op == 0x73:  # SETITEM s
            if sp - 3 < fence or sp < 3 or kind[stack[sp - 3]] != K_DICT:
                return UNSUPPORTED, pos, nn, ne, memo_hi, nr
            kk = kind[stack[sp - 2]]
            if kk == K_LIST or kk == K_DICT or kk == K_TUPLE or kk == K_FLOAT:
                return UNSUPPORTED, pos, nn, ne, memo_hi, nr
            target = stack[sp - 3]
            echild[ne] = stack[sp - 2]
            echild[ne + 1] = stack[sp - 1]
            # children echild[ne:ne + 2] of target: extend its last run when contiguous, else link a
            # new run
            _target = target
            _t = tail[_target]
            if head[_target] >= 0 and run_end[_t] == ne:
                run_end[_t] = ne + 2
            else:
                run_start[nr] = ne
                run_end[nr] = ne + 2
                run_next[nr] = -1
                if head[_target] < 0:
                    head[_target] = nr
                else:
                    run_next[_t] = nr
                tail[_target] = nr
                nr += 1
            ilen[_target] += ne + 2 - (ne)
            ne += 2
            sp -= 2
        # TUPLE t, LIST l, DICT d: from the items since MARK
        elif op == 0x74 or op == 0x6C or op == 0x64:
            if mp == 0:
                return CORRUPT, pos, nn, ne, memo_hi, nr
            mp -= 1
            fence = marks[mp - 1] if mp > 0 else 0
            start = marks[mp]
            if start > sp or (op == 0x64 and (sp - start) % 2 != 0):
                return CORRUPT, pos, nn, ne, memo_hi, nr
            if op == 0x64:
                for i in range(start, sp, 2):
                    kk = kind[stack[i]]
                    if kk == K_LIST or kk == K_DICT or kk == K_TUPLE or kk == K_FLOAT:
                        return UNSUPPORTED, pos, nn, ne, memo_hi, nr
            kind[nn] = K_TUPLE if op == 0x74 else (K_LIST if op == 0x6C else K_DICT)
            ival[nn] = 0
            ilen[nn] = 0
            first = ne
            for i in range(start, sp):
                echild[ne] = stack[i]
                ne += 1
            if ne > first:
                # children echild[first:ne] of nn: extend its last run when contiguous, else link a
                # new run
                _target = nn
                _t = tail[_target]
                if head[_target] >= 0 and run_end[_t] == first:
                    run_end[_t] = ne
                else:
                    run_start[nr] = first
                    run_end[nr] = ne
                    run_next[nr] = -1
                    if head[_target] < 0:
                        head[_target] = nr
                    else:
                        run_next[_t] = nr
                    tail[_target] = nr
                    nr += 1
                ilen[_target] += ne - (first)
            sp = start
            stack[sp] = nn
            sp += 1
            nn += 1
        elif op == 0x85 or op == 0x86 or op == 0x87:  # TUPLE1, TUPLE2, TUPLE3
            count = 1 if op == 0x85 else (2 if op == 0x86 else 3)
            if sp - count < fence or sp < count:
                return UNSUPPORTED, pos, nn, ne, memo_hi, nr
            kind[nn] = K_TUPLE
            ival[nn] = 0
            ilen[nn] = 0
            first = ne
            for i in range(sp - count, sp):
                echild[ne] = stack[i]
                ne += 1
            # children echild[first:ne] of nn: extend its last run when contiguous, else link a new
            # run
            _target = nn
            _t = tail[_target]
            if head[_target] >= 0 and run_end[_t] == first:
                run_end[_t] = ne
            else:
                run_start[nr] = first
                run_end[nr] = ne
                run_next[nr] = -1
                if head[_target] < 0:
                    head[_target] = nr
                else:
                    run_next[_t] = nr
                tail[_target] = nr
                nr += 1
            ilen[_target] += ne - (first)
            sp -= count
            stack[sp] = nn
            sp += 1
            nn += 1
        elif op == 0x30:  # POP (the reference pops the MARK itself when nothing is above it)
            if sp <= fence or sp == 0:
                return UNSUPPORTED, pos, nn, ne, memo_hi, nr
            sp -= 1
        elif op == 0x31:  # POP_MARK
            if mp == 0:
                return CORRUPT, pos, nn, ne, memo_hi, nr
            mp -= 1
            fence = marks[mp - 1] if mp > 0 else 0
            sp = marks[mp]
        elif op == 0x32:  # DUP
            if sp <= fence or sp == 0:
                return UNSUPPORTED, pos, nn, ne, memo_hi, nr
            stack[sp] = stack[sp - 1]
            sp += 1
        elif op == 0x2E:  # STOP
            if sp != 1 or mp != 0:
                return CORRUPT, pos, nn, ne, memo_hi, nr
            root = stack[0]
            break
        else:
            return UNSUPPORTED, pos, nn, ne, memo_hi, nr
    if root < 0:
        return CORRUPT, pos, nn, ne, memo_hi, nr
    if pos != n:
        return CORRUPT, pos, nn, ne, memo_hi, nr
    return OK, root, nn, ne, memo_hi, nr


@njit(cache=True, nogil=True)
def _key_of(node, buf, kind, ival, ilen, key_bytes, key_offsets, cache):
    """Index of a str node in the key table (-1 if none), cached per node."""
    if kind[node] != K_STR:
        return -1
    cached = cache[node]
    if cached != -2:
        return cached
    found = -1
    start = ival[node]
    length = ilen[node]
    for k in range(key_offsets.shape[0] - 1):
        ks = key_offsets[k]
        kl = key_offsets[k + 1] - ks
        if kl != length:
            continue
        same = True
        for i in range(kl):
            if buf[start + i] != key_bytes[ks + i]:
                same = False
                break
        if same:
            found = k
            break
    cache[node] = found
    return found


@njit(cache=True, nogil=True)
def _extract(
    buf,
    root,
    kind,
    ival,
    ilen,
    nn,
    head,
    run_start,
    run_end,
    run_next,
    echild,
    key_bytes,
    key_offsets,
    int_slot_of_key,
    max_frames,
    cache,
    tensor_dims,
    dims,
    dtype_nodes,
    frame_name,
    frame_file,
    frame_line,
    scratch_a,
    scratch_b,
    scratch_c,
    budget,
    entry_budget,
):
    """Pass 2: the fields of every entry. Returns status and the column arrays (see parse_dump).
    Elements (entries + shapes + dims + dtypes + frames kept, counted as the reference counts them)
    beyond `budget`, entries beyond `entry_budget`, or output beyond the workspace's arrays: LIMIT
    (the reference then applies the limits)."""
    out_cap = min(tensor_dims.shape[1], dims.shape[1], dtype_nodes.shape[1])
    frame_cap = min(frame_name.shape[0], frame_file.shape[0], frame_line.shape[0])
    for i in range(nn):
        cache[i] = -2
    entries = -1
    status = OK
    n_ent = 0
    earr = echild
    efirst = 0
    if kind[root] != K_DICT:
        status = NOT_A_DUMP
    else:
        # children of root (one batch: a slice of echild; several: copied into scratch_b)
        _r = head[root]
        if _r < 0:
            arr = echild
            first = 0
            count = 0
        elif run_next[_r] < 0:
            arr = echild
            first = run_start[_r]
            count = run_end[_r] - run_start[_r]
        else:
            count = 0
            while _r >= 0:
                for _j in range(run_start[_r], run_end[_r]):
                    scratch_b[count] = echild[_j]
                    count += 1
                _r = run_next[_r]
            arr = scratch_b
            first = 0
        for j in range(first, first + count, 2):
            # 'entries'
            if _key_of(arr[j], buf, kind, ival, ilen, key_bytes, key_offsets, cache) == 22:
                entries = arr[j + 1]
        if entries >= 0:
            if kind[entries] != K_LIST:
                status = NOT_A_DUMP
            else:
                # children of entries (one batch: a slice of echild; several: copied into scratch_a)
                _r = head[entries]
                if _r < 0:
                    earr = echild
                    efirst = 0
                    n_ent = 0
                elif run_next[_r] < 0:
                    earr = echild
                    efirst = run_start[_r]
                    n_ent = run_end[_r] - run_start[_r]
                else:
                    n_ent = 0
                    while _r >= 0:
                        for _j in range(run_start[_r], run_end[_r]):
                            scratch_a[n_ent] = echild[_j]
                            n_ent += 1
                        _r = run_next[_r]
                    earr = scratch_a
                    efirst = 0
    # ints[slot, e] with valid[slot, e]; flags rows: 0 is_p2p, 1 retired (-1 null)
    ints = np.zeros((9, n_ent), np.int64)
    valid = np.zeros((9, n_ent), np.int8)
    flags = np.full((2, n_ent), -1, np.int8)
    # string node ids per entry: 0 op, 1 state, 2 pg name, 3 pg desc (-1 null)
    strs = np.full((4, n_ent), -1, np.int64)
    # list columns: per entry counts for input_sizes(0), output_sizes(1), input_dtypes(2),
    # output_dtypes(3), frames(4); -1 = null
    counts = np.full((5, n_ent), -1, np.int64)
    # workspace: tensor_dims/dims/dtype_nodes are (2, capacity), frame_* (capacity,)
    n_tensors = np.zeros(2, np.int64)
    n_dims = np.zeros(2, np.int64)
    n_dtype = np.zeros(2, np.int64)
    n_frames = 0
    total = n_ent
    if n_ent > entry_budget or total > budget:
        status = LIMIT
        n_ent = 0
    for e in range(n_ent):
        entry = earr[efirst + e]
        if kind[entry] != K_DICT:
            status = NOT_A_DUMP
            break
        # children of entry (one batch: a slice of echild; several: copied into scratch_b)
        _r = head[entry]
        if _r < 0:
            darr = echild
            dfirst = 0
            dcount = 0
        elif run_next[_r] < 0:
            darr = echild
            dfirst = run_start[_r]
            dcount = run_end[_r] - run_start[_r]
        else:
            dcount = 0
            while _r >= 0:
                for _j in range(run_start[_r], run_end[_r]):
                    scratch_b[dcount] = echild[_j]
                    dcount += 1
                _r = run_next[_r]
            darr = scratch_b
            dfirst = 0
        seen_keys = np.int64(0)
        for j in range(dfirst, dfirst + dcount, 2):
            key_node = darr[j]
            key = cache[key_node] if kind[key_node] == K_STR else -1
            # first time this key string is seen (calls cost array reference counting: rare here)
            if key == -2:
                key = _key_of(key_node, buf, kind, ival, ilen, key_bytes, key_offsets, cache)
            if key < 0:
                continue
            bit = np.int64(1) << key
            # a key twice in one entry: the reference keeps the last, whole; leave it to it
            if seen_keys & bit:
                status = UNSUPPORTED
                break
            seen_keys |= bit
            value = darr[j + 1]
            vk = kind[value]
            slot = int_slot_of_key[key]
            if slot >= 0:
                # (a bool in an integer field: the reference decides, it refuses one as an id)
                if vk == K_INT:
                    ints[slot, e] = ival[value]
                    valid[slot, e] = 1
                elif vk == K_NONE:
                    valid[slot, e] = 0
                else:
                    status = UNSUPPORTED
            elif key == 17 or key == 15:  # is_p2p, retired
                row = 0 if key == 17 else 1
                if vk == K_TRUE or vk == K_FALSE or vk == K_INT:
                    flags[row, e] = 1 if ival[value] != 0 else 0
                elif vk == K_NONE:
                    flags[row, e] = -1
                else:
                    status = UNSUPPORTED
            elif key == 6 or key == 12:  # profiling_name, state
                row = 0 if key == 6 else 1
                if vk == K_STR:
                    strs[row, e] = value
                elif vk != K_NONE:
                    status = UNSUPPORTED
            elif key == 2:  # process_group: (name, desc)
                if vk == K_TUPLE or vk == K_LIST:
                    # children of value (one batch: a slice of echild; several: copied into
                    # scratch_c)
                    _r = head[value]
                    if _r < 0:
                        garr = echild
                        gfirst = 0
                        gcount = 0
                    elif run_next[_r] < 0:
                        garr = echild
                        gfirst = run_start[_r]
                        gcount = run_end[_r] - run_start[_r]
                    else:
                        gcount = 0
                        while _r >= 0:
                            for _j in range(run_start[_r], run_end[_r]):
                                scratch_c[gcount] = echild[_j]
                                gcount += 1
                            _r = run_next[_r]
                        garr = scratch_c
                        gfirst = 0
                    for i in range(min(gcount, 2)):
                        item = garr[gfirst + i]
                        if kind[item] == K_STR:
                            strs[2 + i, e] = item
                        elif kind[item] != K_NONE:
                            status = UNSUPPORTED
                elif vk != K_NONE:
                    status = UNSUPPORTED
            elif key == 8 or key == 10:  # input_sizes, output_sizes: list of lists of ints
                side = 0 if key == 8 else 1
                if vk == K_LIST or vk == K_TUPLE:
                    # children of value (one batch: a slice of echild; several: copied into
                    # scratch_c)
                    _r = head[value]
                    if _r < 0:
                        larr = echild
                        lfirst = 0
                        m = 0
                    elif run_next[_r] < 0:
                        larr = echild
                        lfirst = run_start[_r]
                        m = run_end[_r] - run_start[_r]
                    else:
                        m = 0
                        while _r >= 0:
                            for _j in range(run_start[_r], run_end[_r]):
                                scratch_c[m] = echild[_j]
                                m += 1
                            _r = run_next[_r]
                        larr = scratch_c
                        lfirst = 0
                    counts[side, e] = m
                    total += m
                    if total > budget or n_tensors[side] + m > out_cap:
                        status = LIMIT
                        m = 0
                    for i in range(m):
                        tensor = larr[lfirst + i]
                        tk = kind[tensor]
                        if tk != K_LIST and tk != K_TUPLE:
                            status = UNSUPPORTED
                            break
                        r = head[tensor]
                        d = ilen[tensor]
                        total += d
                        if total > budget or n_dims[side] + d > out_cap:
                            status = LIMIT
                            break
                        tensor_dims[side, n_tensors[side]] = d
                        n_tensors[side] += 1
                        while r >= 0:  # dims, run by run (no scratch: the outer list may be in one)
                            for q in range(run_start[r], run_end[r]):
                                dim = echild[q]
                                if kind[dim] != K_INT:
                                    status = UNSUPPORTED
                                    break
                                dims[side, n_dims[side]] = ival[dim]
                                n_dims[side] += 1
                            r = run_next[r]
                elif vk != K_NONE:
                    status = UNSUPPORTED
            elif key == 9 or key == 11:  # input_dtypes, output_dtypes: list of str
                side = 0 if key == 9 else 1
                if vk == K_LIST or vk == K_TUPLE:
                    # children of value (one batch: a slice of echild; several: copied into
                    # scratch_c)
                    _r = head[value]
                    if _r < 0:
                        larr = echild
                        lfirst = 0
                        m = 0
                    elif run_next[_r] < 0:
                        larr = echild
                        lfirst = run_start[_r]
                        m = run_end[_r] - run_start[_r]
                    else:
                        m = 0
                        while _r >= 0:
                            for _j in range(run_start[_r], run_end[_r]):
                                scratch_c[m] = echild[_j]
                                m += 1
                            _r = run_next[_r]
                        larr = scratch_c
                        lfirst = 0
                    counts[2 + side, e] = m
                    total += m
                    if total > budget or n_dtype[side] + m > out_cap:
                        status = LIMIT
                        m = 0
                    for i in range(m):
                        item = larr[lfirst + i]
                        if kind[item] != K_STR:
                            status = UNSUPPORTED
                            break
                        dtype_nodes[side, n_dtype[side]] = item
                        n_dtype[side] += 1
                elif vk != K_NONE:
                    status = UNSUPPORTED
            elif key == 18 and max_frames > 0:  # frames: list of {name, filename, line}
                if vk == K_LIST or vk == K_TUPLE:
                    # children of value (one batch: a slice of echild; several: copied into
                    # scratch_c)
                    _r = head[value]
                    if _r < 0:
                        larr = echild
                        lfirst = 0
                        m = 0
                    elif run_next[_r] < 0:
                        larr = echild
                        lfirst = run_start[_r]
                        m = run_end[_r] - run_start[_r]
                    else:
                        m = 0
                        while _r >= 0:
                            for _j in range(run_start[_r], run_end[_r]):
                                scratch_c[m] = echild[_j]
                                m += 1
                            _r = run_next[_r]
                        larr = scratch_c
                        lfirst = 0
                    kept = min(m, max_frames)
                    counts[4, e] = kept
                    total += kept
                    if total > budget or n_frames + kept > frame_cap:
                        status = LIMIT
                        kept = 0
                    for i in range(kept):
                        frame = larr[lfirst + i]
                        frame_name[n_frames] = -1
                        frame_file[n_frames] = -1
                        frame_line[n_frames] = -1
                        if kind[frame] != K_DICT:
                            status = UNSUPPORTED
                            break
                        r = head[frame]
                        while r >= 0:
                            for f in range(run_start[r], run_end[r], 2):
                                fnode = echild[f]
                                fk = cache[fnode] if kind[fnode] == K_STR else -1
                                if fk == -2:
                                    fk = _key_of(
                                        fnode, buf, kind, ival, ilen, key_bytes, key_offsets, cache
                                    )
                                fv = echild[f + 1]
                                fvk = kind[fv]
                                if fk == 19 or fk == 20:
                                    if fvk == K_STR:
                                        if fk == 19:
                                            frame_name[n_frames] = fv
                                        else:
                                            frame_file[n_frames] = fv
                                    elif fvk == K_NONE:
                                        if fk == 19:
                                            frame_name[n_frames] = -1
                                        else:
                                            frame_file[n_frames] = -1
                                    else:
                                        status = UNSUPPORTED
                                elif fk == 21:
                                    if fvk == K_INT and ival[fv] >= 0:
                                        frame_line[n_frames] = ival[fv]
                                    elif fvk == K_NONE:
                                        frame_line[n_frames] = -1
                                    else:
                                        status = UNSUPPORTED
                            r = run_next[r]
                        n_frames += 1
                        if status != OK:
                            break
                elif vk != K_NONE:
                    status = UNSUPPORTED
            if status != OK:
                break
        if status != OK:
            break
    sizes = (tensor_dims[0, :n_tensors[0]].copy(), dims[0, :n_dims[0]].copy(),
             tensor_dims[1, :n_tensors[1]].copy(), dims[1, :n_dims[1]].copy())
    dtypes = (dtype_nodes[0, :n_dtype[0]].copy(), dtype_nodes[1, :n_dtype[1]].copy())
    frames = (
        frame_name[:n_frames].copy(),
        frame_file[:n_frames].copy(),
        frame_line[:n_frames].copy(),
    )
    return status, entries, (ints, valid, strs, flags), counts, sizes, dtypes, frames


@njit(cache=True, nogil=True)
def _top(
    buf,
    root,
    kind,
    ival,
    ilen,
    head,
    run_start,
    run_end,
    run_next,
    echild,
    key_bytes,
    key_offsets,
    cache,
):
    """The root's small fields without Python objects: value nodes of TOP_FIELDS (-1 absent);
    pg_config rows (key, name, desc, ranks nodes); pg_status rows (key node, enqueued, started,
    completed; -1 absent). ok is False when a shape is unexpected (the caller then walks the tape
    generically)."""
    top = np.full(9, -1, np.int64)  # TOP_FIELDS, then 'entries'
    ok = True
    r = head[root]
    while r >= 0:
        for j in range(run_start[r], run_end[r], 2):
            k = _key_of(echild[j], buf, kind, ival, ilen, key_bytes, key_offsets, cache)
            if 23 <= k <= 30:
                top[k - 23] = echild[j + 1]
            elif k == 22:
                top[8] = echild[j + 1]
        r = run_next[r]
    config = top[1]
    n_cfg = ilen[config] // 2 if config >= 0 and kind[config] == K_DICT else 0
    cfg = np.full((n_cfg, 4), -1, np.int64)
    if config >= 0 and kind[config] != K_DICT and kind[config] != K_NONE:
        ok = False
    i = 0
    r = head[config] if n_cfg > 0 else -1
    while r >= 0:
        for j in range(run_start[r], run_end[r], 2):
            cfg[i, 0] = echild[j]
            value = echild[j + 1]
            if kind[value] == K_DICT:
                q = head[value]
                while q >= 0:
                    for f in range(run_start[q], run_end[q], 2):
                        k = _key_of(echild[f], buf, kind, ival, ilen, key_bytes, key_offsets, cache)
                        if k == 19:
                            cfg[i, 1] = echild[f + 1]
                        elif k == 31:
                            cfg[i, 2] = echild[f + 1]
                        elif k == 32:
                            cfg[i, 3] = echild[f + 1]
                    q = run_next[q]
            else:
                ok = False
            i += 1
        r = run_next[r]
    status = top[2]
    n_st = ilen[status] // 2 if status >= 0 and kind[status] == K_DICT else 0
    if status >= 0 and kind[status] != K_DICT and kind[status] != K_NONE:
        ok = False
    st = np.full((n_st, 4), -1, np.int64)
    i = 0
    r = head[status] if n_st > 0 else -1
    while r >= 0:
        for j in range(run_start[r], run_end[r], 2):
            st[i, 0] = echild[j]
            value = echild[j + 1]
            if kind[value] == K_DICT:
                # which of the three keys were seen (a bit each, not a count: a key written twice,
                # e.g. completed twice and enqueued absent, counted three and read the absent one as
                # -1)
                found = 0
                q = head[value]
                while q >= 0:
                    for f in range(run_start[q], run_end[q], 2):
                        k = _key_of(echild[f], buf, kind, ival, ilen, key_bytes, key_offsets, cache)
                        v = echild[f + 1]
                        if 33 <= k <= 35:
                            found |= 1 << (k - 33)
                            if kind[v] == K_INT:
                                st[i, k - 32] = ival[v]
                            else:
                                ok = False
                    q = run_next[q]
                # exactly the three keys, each once, else the generic walk (absent != -1; the last
                # of a repeated key wins, as in the reference)
                if found != 7 or ilen[value] != 6:
                    ok = False
            else:
                ok = False
            i += 1
        r = run_next[r]
    return ok, top, cfg, st


#: the tape's node ids, child edges, runs and string lengths are int32 (half the workspace of int64:
#: the tape of a 0.5 MB dump stays in a core's L2 cache, and the scan is ~12% faster); every opcode
#: adds at most one node, edge or run, so a buffer below this size cannot overflow them. Larger
#: buffers are left to the restricted unpickler (Workspace.parse declines them), which only a raised
#: FAULTLENS_FR_MAX_FILE_BYTES lets through.
MAX_BUFFER_BYTES = (1 << 31) - (1 << 20)


class Workspace:
    """Scratch arrays reused across files by one thread (allocating them per file costs more than
    parsing).
    """

    def __init__(self, capacity: int = 1 << 16) -> None:
        self.capacity = 0
        self._used = 0  # nodes of the last parse
        self._stale = 0  # node heads to reset before the next parse
        self.ensure(capacity)

    def ensure(self, size: int) -> None:
        need = size + 16
        if need <= self.capacity:
            return
        cap = max(need, int(self.capacity * 1.5))
        self.kind = np.empty(cap, np.int8)
        self.ival = np.empty(cap, np.int64)
        self.ilen = np.empty(cap, np.int32)
        # unused by the tape now (kept in the kernel signature)
        self.eparent = np.empty(1, np.int64)
        self.echild = np.empty(cap, np.int32)
        self.stack = np.empty(cap, np.int32)
        self.marks = np.empty(cap, np.int32)
        self.memo = np.full(cap, -1, np.int32)
        self.head = np.full(cap, -1, np.int32)
        self.tail = np.empty(cap, np.int32)
        self.run_start = np.empty(cap, np.int32)
        self.run_end = np.empty(cap, np.int32)
        self.run_next = np.empty(cap, np.int32)
        self.scratch_a = np.empty(cap, np.int32)
        self.scratch_b = np.empty(cap, np.int32)
        self.scratch_c = np.empty(cap, np.int32)
        self.cache = np.empty(cap, np.int32)
        self.tensor_dims = np.empty((2, cap), np.int64)
        self.dims = np.empty((2, cap), np.int64)
        self.dtype_nodes = np.empty((2, cap), np.int64)
        self.frame_name = np.empty(cap, np.int64)
        self.frame_file = np.empty(cap, np.int64)
        self.frame_line = np.empty(cap, np.int64)
        self.intern_table = np.full(cap, -1, np.int64)
        self.intern_order = np.empty(cap, np.int64)
        self.capacity = cap

    def intern(self, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Dense codes (int32, -1 null) for node ids and the distinct nodes in first-seen order
        (after a parse).
        """
        return intern(np.ascontiguousarray(nodes), self.intern_table, self.intern_order)

    def parse(self, buf: np.ndarray, max_frames: int, bounds: np.ndarray | None = None) -> tuple:
        """parse_dump of `buf` (uint8) with this workspace; call release() when done with the tape.
        bounds: int64 (max string bytes, element budget, entry budget); default: no limit beyond the
        workspace's arrays. ValueError from MAX_BUFFER_BYTES on (the caller's reference reader takes
        those)."""
        if buf.shape[0] >= MAX_BUFFER_BYTES:
            raise ValueError(f"{buf.shape[0]} bytes: more than the scanner's 32-bit tape holds")
        self.ensure(int(buf.shape[0]))
        if bounds is None:
            bounds = np.array([1 << 62, 1 << 62, 1 << 62], np.int64)
        stale, self._stale = self._stale, 0
        result = parse_dump(
            buf,
            max_frames,
            self.kind,
            self.ival,
            self.ilen,
            self.eparent,
            self.echild,
            self.stack,
            self.marks,
            self.memo,
            self.head,
            self.tail,
            self.run_start,
            self.run_end,
            self.run_next,
            self.cache,
            self.tensor_dims,
            self.dims,
            self.dtype_nodes,
            self.frame_name,
            self.frame_file,
            self.frame_line,
            self.scratch_a,
            self.scratch_b,
            self.scratch_c,
            bounds,
            self.intern_table,
            self.intern_order,
            stale,
        )
        self._used = int(result[6])
        return result

    def release(self) -> None:
        """Done with the last parse's tape: the node heads it set are reset (the workspace's
        invariant: all -1 when a parse starts) by the next parse, in its compiled call."""
        self._stale = max(self._stale, self._used)
        self._used = 0


@njit(cache=True, nogil=True)
def parse_dump(
    buf,
    max_frames,
    kind,
    ival,
    ilen,
    eparent,
    echild,
    stack,
    marks,
    memo,
    head,
    tail,
    run_start,
    run_end,
    run_next,
    cache,
    tensor_dims,
    dims,
    dtype_nodes,
    frame_name,
    frame_file,
    frame_line,
    scratch_a,
    scratch_b,
    scratch_c,
    bounds,
    intern_table,
    intern_order,
    stale,
):
    """Both passes, and the string columns interned. Returns (status, root, kind, ival, ilen, (head,
    run_start, run_end, run_next, echild), n_nodes, (ints, valid, strs, flags), counts, sizes,
    dtypes, frames, top, (codes, distinct), pg_groups); the tape arrays are the workspace's (valid
    until its next parse). codes and distinct: per string column (the four rows of strs, then the
    two dtypes columns), `intern` of its nodes; pg_groups: `unique_first` of the entries' pg_id."""
    # bounds: (max string bytes, element budget, entry budget) from
    # faultlens.collectors.artifacts.fr_limits; stale: node heads the previous parse set
    # (Workspace.release)
    for i in range(min(stale, head.shape[0])):
        head[i] = -1
    status, root, kind, ival, ilen, nn, eparent, echild, _ne, _nr = _tape(
        buf,
        kind,
        ival,
        ilen,
        eparent,
        echild,
        stack,
        marks,
        memo,
        head,
        tail,
        run_start,
        run_end,
        run_next,
        bounds[0],
    )
    links = (head, run_start, run_end, run_next, echild)
    if status != OK:
        empty = np.empty(0, np.int64)
        no_codes = np.empty(0, np.int32)
        return (
            status,
            root,
            kind,
            ival,
            ilen,
            links,
            nn,
            (
                np.empty((9, 0), np.int64),
                np.empty((9, 0), np.int8),
                np.empty((4, 0), np.int64),
                np.empty((2, 0), np.int8),
            ),
            np.empty((5, 0), np.int64),
            (empty, empty, empty, empty),
            (empty, empty),
            (empty, empty, empty),
            (
                False,
                np.full(9, -1, np.int64),
                np.empty((0, 4), np.int64),
                np.empty((0, 4), np.int64),
            ),
            (
                (no_codes, no_codes, no_codes, no_codes, no_codes, no_codes),
                (empty, empty, empty, empty, empty, empty),
            ),
            (empty, empty, no_codes),
        )
    result = _extract(
        buf,
        root,
        kind,
        ival,
        ilen,
        nn,
        head,
        run_start,
        run_end,
        run_next,
        echild,
        KEY_BYTES,
        KEY_OFFSETS,
        INT_SLOT_OF_KEY,
        max_frames,
        cache,
        tensor_dims,
        dims,
        dtype_nodes,
        frame_name,
        frame_file,
        frame_line,
        scratch_a,
        scratch_b,
        scratch_c,
        bounds[1],
        bounds[2],
    )
    top = (
        _top(
            buf,
            root,
            kind,
            ival,
            ilen,
            head,
            run_start,
            run_end,
            run_next,
            echild,
            KEY_BYTES,
            KEY_OFFSETS,
            cache,
        )
        if result[0] == OK
        else (
            False,
            np.full(9, -1, np.int64),
            np.empty((0, 4), np.int64),
            np.empty((0, 4), np.int64),
        )
    )
    strs = result[2][2]
    dtypes = result[5]
    c0, d0 = intern(strs[0], intern_table, intern_order)
    c1, d1 = intern(strs[1], intern_table, intern_order)
    c2, d2 = intern(strs[2], intern_table, intern_order)
    c3, d3 = intern(strs[3], intern_table, intern_order)
    c4, d4 = intern(dtypes[0], intern_table, intern_order)
    c5, d5 = intern(dtypes[1], intern_table, intern_order)
    groups = unique_first(result[2][0][1], result[2][1][1])  # pg_id: INT_FIELDS[1]
    return (
        result[0],
        root,
        kind,
        ival,
        ilen,
        links,
        nn,
        result[2],
        result[3],
        result[4],
        result[5],
        result[6],
        top,
        ((c0, c1, c2, c3, c4, c5), (d0, d1, d2, d3, d4, d5)),
        groups,
    )


@njit(cache=True, nogil=True)
def intern(nodes, table, order):
    """Codes for node ids without sorting: table (all -1 on entry and on exit) maps node -> code."""
    codes = np.empty(nodes.shape[0], np.int32)
    count = 0
    for i in range(nodes.shape[0]):
        node = nodes[i]
        if node < 0:
            codes[i] = -1
            continue
        code = table[node]
        if code < 0:
            code = count
            table[node] = code
            order[count] = node
            count += 1
        codes[i] = code
    distinct = order[:count].copy()
    for j in range(count):
        table[distinct[j]] = -1
    return codes, distinct


_FEW = 16  # distinct values found by a linear search; more: sorted (stable)


@njit(cache=True, nogil=True)
def unique_first(values, valid):
    """np.unique(values[valid], return_index=True) in rows, and each row's code: the distinct values
    sorted, the first row of each, and each row's index into them (int32, -1 where not valid). A
    dump's entries name a few process groups: those are found by a linear search; beyond _FEW
    distinct values, by a stable sort."""
    n = values.shape[0]
    codes = np.full(n, -1, np.int32)
    seen = np.empty(_FEW, values.dtype)
    seen_first = np.empty(_FEW, np.int64)
    k = 0
    few = True
    for i in range(n):
        if not valid[i]:
            continue
        value = values[i]
        code = -1
        for j in range(k):
            if seen[j] == value:
                code = j
                break
        if code < 0:
            if k == _FEW:
                few = False
                break
            seen[k] = value
            seen_first[k] = i
            code = k
            k += 1
        codes[i] = code
    if few:
        order = np.argsort(seen[:k], kind="mergesort")  # distinct values: no ties
        rank = np.empty(k, np.int32)
        for j in range(k):
            rank[order[j]] = j
        for i in range(n):
            if codes[i] >= 0:
                codes[i] = rank[codes[i]]
        return seen[:k][order].copy(), seen_first[:k][order].copy(), codes
    rows = np.empty(n, np.int64)
    m = 0
    for i in range(n):
        if valid[i]:
            rows[m] = i
            m += 1
    rows = rows[:m]
    # stable: the first of equal values is the first row
    order = np.argsort(values[rows], kind="mergesort")
    distinct = np.empty(m, values.dtype)
    first = np.empty(m, np.int64)
    codes[:] = -1
    k = -1
    for j in range(m):
        row = rows[order[j]]
        value = values[row]
        if k < 0 or value != distinct[k]:
            k += 1
            distinct[k] = value
            first[k] = row
        codes[row] = k
    return distinct[:k + 1].copy(), first[:k + 1].copy(), codes
