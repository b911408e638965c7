"""The opcode pre-passes of the restricted unpickler, run before the C unpickler sees a pickle:
check_opcodes (refused opcodes and globals, lengths, memo indices, limits; linear, allocating
nothing an argument's size) and the tuple-hashing bound it runs for pickles with tuples."""

from __future__ import annotations

import pickle
import re
from typing import Any

from faultlens.collectors.artifacts.fr_limits import DumpLimits, default_limits
from faultlens.collectors.artifacts.safe_pickle_admitted import (
    ADMITTED_GLOBALS,
    PickleLoadError,
    UnsafePickleError,
)

# runs of opcodes that need no check (their arguments cannot allocate) are skipped at C speed:
# fixed-size ones, LONG1 up to 8 bytes, and LONG_BINPUT with an index that the data's size admits
# (see _fixed_run)
# (the opcodes that build a container are not skipped: the loop charges each its object's size)
_FIXED_BODY = (rb"[(012NRaesu\x88\x89\x94]|[Khq].|M..|[Jj]....|G.{8}|\x8a(?:"
               + b"|".join(re.escape(bytes([k])) + b"." * k for k in range(9)) + b")")
_FIXED_RUNS = [
    (1 << 8, re.compile(b"(?:" + _FIXED_BODY + rb"|r.\x00\x00\x00)*", re.DOTALL)),
    (0, re.compile(b"(?:" + _FIXED_BODY + b")*", re.DOTALL)),
]


def _fixed_run(n: int) -> Any:
    """The skipping expression for data of n bytes: LONG_BINPUT indices it skips are below n and
    below 256 (higher ones go through the loop, which keeps the memo's highest index: the memo is
    an array as long as that)."""
    return next(pattern for floor, pattern in _FIXED_RUNS if min(n, 1 << 8) >= floor).match


_FIXED_OPS = frozenset(b"()012NRaestu\x85\x86\x87\x88\x89\x94KhqMJjG")
# what an opcode that builds a container allocates (CPython 3.11, 64-bit: sys.getsizeof of the
# empty object); TUPLE1-3 and TUPLE are charged in the tuple branch
# plus 16 for the slots it takes (on the unpickler's stack, then in the container that holds it)
_CONTAINER_COST = {
    ord("]"): 72, ord("l"): 72,  # EMPTY_LIST, LIST
    ord("}"): 80, ord("d"): 80,  # EMPTY_DICT, DICT
    0x8F: 232, 0x91: 232,  # EMPTY_SET, FROZENSET
    0x90: 0,  # ADDITEMS (its items were charged when pushed)
}
_TUPLE_COST = 80
# an empty str / bytes object and its slots; a str's text is charged at 2x
_STR_COST, _BYTES_COST = 65, 49
# what a skipped byte of fixed-size opcodes can cost at most: a slot in a list, the stack or the
# memo (8 bytes each), an int (28 bytes for 3 bytes of BININT2), a dict item's share of its table
_FIXED_BYTE_COST = 24
_MEMO_SLOT_COST = 16  # the memo is an array of pointers grown by doubling
_REFUSED_OPS = {
    ord("b"): "BUILD",
    ord("i"): "INST",
    ord("o"): "OBJ",
    0x81: "NEWOBJ",
    0x92: "NEWOBJ_EX",
    0x93: "STACK_GLOBAL",
    0x82: "EXT1",
    0x83: "EXT2",
    0x84: "EXT4",
    ord("P"): "PERSID",
    ord("Q"): "BINPERSID",
    0x97: "NEXT_BUFFER",
    0x98: "READONLY_BUFFER",
}
# length-prefixed data: opcode -> (length bytes, signed, what)
_SIZED_OPS = {
    ord("X"): (4, False, "string"), 0x8C: (1, False, "string"), 0x8D: (8, False, "string"),
    ord("B"): (4, False, "bytes"), ord("C"): (1, False, "bytes"), 0x8E: (8, False, "bytes"),
    0x96: (8, False, "bytes"), ord("T"): (4, True, "bytes"), ord("U"): (1, False, "bytes"),
    0x8A: (1, False, "int"), 0x8B: (4, True, "int"),
}
_TEXT_OPS = {ord("I"), ord("L"), ord("F"), ord("g"), ord("p"), ord("S"), ord("V")}
_DIGITS = re.compile(rb"-?\d+L?")


# an encoded surrogate (U+D800..U+DFFF): what 'surrogatepass' lets through
_SURROGATE_BYTES = re.compile(rb"\xed[\xa0-\xbf]")


def check_opcodes(data: bytes, limits: DumpLimits | None = None) -> bool:
    """Walk the opcodes up to the first STOP; raise UnsafePickleError / PickleLoadError (no source
    prefix) for what the module docstring lists. Linear in the data, allocates nothing the size of
    an argument. Returns whether the loaded value must still be checked for surrogates (protocol 0
    text with \\u escapes).

    The opcodes every dump is full of (strings, containers, tuples, memo indices past 255) are
    checked in this loop; the rare ones (protocol 0 text, PROTO, FRAME, refused and unknown
    opcodes) in a call each (_check_text_op, _check_rare_op), which keeps the loop short without a
    call per common opcode. The loop also adds up what the load will allocate (every container,
    string and bytes object at its size, the memo at its highest index, each skipped byte at the
    most a fixed-size opcode can cost): beyond limits.alloc_budget(size) the pickle is refused
    before the unpickler builds anything (a file of one-byte EMPTY_SET opcodes builds 216 bytes a
    byte).
    """
    limits = limits or default_limits()
    n = len(data)
    pos = 0
    skip = _fixed_run(n)
    walk = False
    tuples = 0
    max_string = limits.max_string_bytes
    max_int = limits.max_int_bytes
    alloc = 0  # bytes the load builds, beyond the skipped bytes' share
    skipped = 0
    max_memo = 0
    containers = _CONTAINER_COST
    budget = limits.alloc_budget(n)
    while True:
        end = skip(data, pos).end()
        skipped += end - pos
        pos = end
        if pos >= n:
            raise PickleLoadError("truncated (ran out of input)")
        op = data[pos]
        if op == 0x2E:  # STOP: the unpickler reads nothing after it
            _check_alloc(alloc + skipped * _FIXED_BYTE_COST + max_memo * _MEMO_SLOT_COST, n,
                         limits)
            if tuples:
                _check_hashing(data, pos, limits)
            return walk
        arg = pos + 1
        cost = containers.get(op)
        if cost is not None:
            alloc += cost
            pos = arg
            if alloc > budget:  # refused at once, not after the rest of a bomb
                _check_alloc(alloc, n, limits)
            continue
        if op in _TUPLE_OPS:
            tuples += 1
            alloc += _TUPLE_COST
            pos = arg
            continue
        sized = _SIZED_OPS.get(op)
        if sized is not None:
            width, signed, what = sized
            if arg + width > n:
                raise PickleLoadError("truncated (ran out of input)")
            length = int.from_bytes(data[arg:arg + width], "little", signed=signed)
            start = arg + width
            if length < 0:
                raise PickleLoadError(f"negative {what} length at offset {pos}")
            if what == "int" and length > max_int:
                raise PickleLoadError(
                    f"integer of {length} bytes at offset {pos} (limit {max_int})"
                )
            if length > n - start:
                raise PickleLoadError(f"truncated: a {what} of {length} bytes at offset {pos} runs "
                                      "past the end")
            if length > max_string:
                raise PickleLoadError(f"{what} of {length} bytes at offset {pos} (limit "
                                      f"{max_string})")
            if what == "string":
                if _SURROGATE_BYTES.search(data, start, start + length):
                    raise PickleLoadError(f"string at offset {pos} is not valid UTF-8 (an encoded "
                                          "surrogate)")
                alloc += _STR_COST + 2 * length
            else:
                alloc += _BYTES_COST + length
            pos = start + length
        elif op == 0x72:  # LONG_BINPUT
            if arg + 4 > n:
                raise PickleLoadError("truncated (ran out of input)")
            index = int.from_bytes(data[arg:arg + 4], "little")
            if index >= n:
                raise PickleLoadError(f"memo index {index} at offset {pos} beyond the data's {n} "
                                      "bytes")
            if index > max_memo:
                max_memo = index
            pos = arg + 4
        # text arguments (protocol 0), GLOBAL: newline-terminated
        elif op in _TEXT_OPS or op == 0x63:
            start = pos
            pos, escapes = _check_text_op(data, pos, op, limits)
            walk = walk or escapes
            # a text string's object (at most 4 bytes a character), a number, a memo slot
            alloc += _STR_COST + 4 * (pos - start) if op in (0x53, 0x56) else 64
            if op == 0x70:  # PUT
                max_memo = max(max_memo, int(data[start + 1:pos - 1].rstrip(b"L")))
        else:
            pos = _check_rare_op(data, pos, op)


def _check_alloc(estimate: int, n: int, limits: DumpLimits) -> None:
    budget = limits.alloc_budget(n)
    if estimate > budget:
        raise PickleLoadError(
            f"would build ~{estimate >> 20} MiB of objects from {n} bytes, more than a dump may "
            f"({budget >> 20} MiB: limit fr_limits alloc_per_byte / max_alloc_bytes)"
        )


def _check_rare_op(data: bytes, pos: int, op: int) -> int:
    """PROTO and FRAME (checked: returns the next opcode's offset); a refused, cut or unknown opcode
    raises.
    """
    n = len(data)
    arg = pos + 1
    if op == 0x80:  # PROTO
        if arg >= n:
            raise PickleLoadError("truncated (ran out of input)")
        if data[arg] > pickle.HIGHEST_PROTOCOL:
            raise PickleLoadError(f"unsupported pickle protocol: {data[arg]}")
        return arg + 1
    if op == 0x95:  # FRAME
        if arg + 8 > n:
            raise PickleLoadError("truncated (ran out of input)")
        length = int.from_bytes(data[arg:arg + 8], "little")
        if length > n - arg - 8:
            raise PickleLoadError(f"truncated: a frame of {length} bytes at offset {pos} runs past "
                                  "the end")
        return arg + 8
    if op in _REFUSED_OPS:
        raise UnsafePickleError(f"refused opcode {_REFUSED_OPS[op]} at offset {pos}: only builtin "
                                "containers "
                                "and scalars are admitted")
    if op in _FIXED_OPS:
        raise PickleLoadError("truncated (ran out of input)")
    raise PickleLoadError(f"invalid opcode 0x{op:02x} at offset {pos}")


def _check_text_op(data: bytes, pos: int, op: int, limits: DumpLimits) -> tuple[int, bool]:
    """A protocol 0 opcode with newline-terminated text (GLOBAL: two lines): the next opcode's
    offset, and whether the text may spell a surrogate (raw-unicode-escape: then the loaded value is
    checked after the load)."""
    max_string = limits.max_string_bytes
    lines = 2 if op == 0x63 else 1
    end = pos + 1
    names = []
    escapes = False
    for _ in range(lines):
        stop = data.find(b"\n", end)
        if stop < 0:
            raise PickleLoadError("truncated (ran out of input)")
        if op in (ord("S"), ord("V")):
            if op == ord("V") and (
                data.find(b"\\u", end, stop) >= 0 or data.find(b"\\U", end, stop) >= 0
            ):
                escapes = True
            if stop - end > 4 * max_string:
                raise PickleLoadError(f"string of {stop - end} bytes at offset {pos} (limit "
                                      f"{max_string})")
        elif op == 0x63:
            if stop - end > 256:
                raise UnsafePickleError(f"refused global of {stop - end} bytes at offset {pos}")
            names.append(bytes(data[end:stop]).decode("latin-1"))
        else:
            _check_number_text(bytes(data[end:stop]), pos, op, len(data), limits)
        end = stop + 1
    if op == 0x63 and tuple(names) not in ADMITTED_GLOBALS:
        raise UnsafePickleError(f"refused global {names[0][:80]}.{names[1][:80]}: only builtin "
                                "containers "
                                "and scalars are admitted")
    return end, escapes


def _check_number_text(text: bytes, pos: int, op: int, n: int, limits: DumpLimits) -> None:
    """INT, LONG, FLOAT, GET, PUT: a number within the limits; a memo index a real value and below
    the data's size.
    """
    if len(text) > limits.max_int_digits + 2:
        raise PickleLoadError(f"number of {len(text)} characters at offset {pos} (limit "
                              f"{limits.max_int_digits})")
    if op in (ord("g"), ord("p")):
        if not _DIGITS.fullmatch(text) or text.startswith(b"-"):
            raise PickleLoadError(f"bad memo index at offset {pos}")
        if op == ord("p") and int(text) >= n:
            raise PickleLoadError(f"memo index {int(text)} at offset {pos} beyond the data's {n} "
                                  "bytes")


_TUPLE_OPS = frozenset(b")t\x85\x86\x87")  # EMPTY_TUPLE, TUPLE, TUPLE1-3
# ints, floats, None, bools, EMPTY_LIST / DICT / SET: opcode -> its size with the argument
_SIMPLE_PUSH = {
    ord("K"): 2,
    ord("M"): 3,
    ord("J"): 5,
    ord("G"): 9,
    ord("N"): 1,
    0x88: 1,
    0x89: 1,
    ord("]"): 1,
    ord("}"): 1,
    0x8F: 1,
}
_ARG_WIDTH = {**{op: 1 for op in b"Khq\x80"}, **{op: 2 for op in b"M"}, **{op: 4 for op in b"Jjr"},
              **{op: 8 for op in b"G\x95"}}


def _check_hashing(data: bytes, end: int, limits: DumpLimits) -> None:
    """A tuple's hash is not cached and visits every item, so a few shared tuples used as dict keys
    or set items ("billion laughs" of tuples) would make the C unpickler hash for hours inside one
    opcode. This second pass (only for pickles with tuples: their weights are tracked through the
    stack and the memo) bounds what the keys and set items of the pickle cost to hash: refused
    beyond limits.element_budget(size). The first pass has checked every length, so arguments can be
    skipped without checks. The opcodes dumps are made of stay in this loop (a call per opcode would
    cost more than the opcode), the rare ones go to _hash_rare_op."""
    budget = limits.element_budget(len(data))
    # per stack item: its weight if it is a tuple (items a hash visits), else 0
    stack: list[int] = []
    push = stack.append
    marks: list[int] = []
    memo: dict[int, int] = {}
    hashed = 0
    pos = 0
    simple = _SIMPLE_PUSH
    while pos < end:
        op = data[pos]
        width = simple.get(op)
        if width is not None:  # a value that is not a tuple, with a fixed-size argument
            push(0)
            pos += width
            continue
        if op == 0x68:  # BINGET
            push(memo.get(data[pos + 1], 0))
            pos += 2
        elif op == 0x71:  # BINPUT
            if stack:
                memo[data[pos + 1]] = stack[-1]
            pos += 2
        elif op == 0x72 or op == 0x6A:  # LONG_BINPUT, LONG_BINGET
            index = int.from_bytes(data[pos + 1:pos + 5], "little")
            if op == 0x72:
                if stack:
                    memo[index] = stack[-1]
            else:
                push(memo.get(index, 0))
            pos += 5
        elif op == 0x28:  # MARK
            marks.append(len(stack))
            pos += 1
        elif op == 0x58 or op == 0x42 or op == 0x54:  # BINUNICODE, BINBYTES, BINSTRING
            push(0)
            pos += 5 + int.from_bytes(data[pos + 1:pos + 5], "little")
        elif op == 0x8C or op == 0x43 or op == 0x55 or op == 0x8A:  # short strings / bytes, LONG1
            push(0)
            pos += 2 + data[pos + 1]
        elif op == 0x29:  # EMPTY_TUPLE
            push(1)
            pos += 1
        elif op == 0x85 or op == 0x86 or op == 0x87 or op == 0x74:  # TUPLE1-3, TUPLE
            start = len(stack) - (op - 0x84) if op != 0x74 else (marks.pop() if marks else 0)
            start = max(start, 0)
            weight = 1 + sum(stack[start:])
            del stack[start:]
            push(weight)
            pos += 1
        elif op == 0x61:  # APPEND
            del stack[-1:]
            pos += 1
        elif op == 0x65 or op == 0x31:  # APPENDS, POP_MARK
            del stack[marks.pop() if marks else 0:]
            pos += 1
        elif op == 0x73:  # SETITEM: the key is hashed
            if len(stack) >= 2:
                hashed += stack[-2]
            del stack[-2:]
            pos += 1
            if hashed > budget:
                break
        # SETITEMS, DICT, ADDITEMS, FROZENSET
        elif op == 0x75 or op == 0x64 or op == 0x90 or op == 0x91:
            start = marks.pop() if marks else 0
            items = stack[start:]
            hashed += sum(items[::2]) if op in (0x75, 0x64) else sum(items)
            del stack[start:]
            if op == 0x64 or op == 0x91:
                push(0)
            pos += 1
            if hashed > budget:
                break
        elif op == 0x94:  # MEMOIZE
            if stack:
                memo[len(memo)] = stack[-1]
            pos += 1
        else:
            pos = _hash_rare_op(data, pos, op, stack, marks, memo)
    if hashed > budget:
        raise PickleLoadError(f"tuples used as keys or set items would cost more than {budget} "
                              "steps to hash "
                              "(shared references?)")


def _hash_rare_op(
    data: bytes, pos: int, op: int, stack: list[int], marks: list[int], memo: dict[int, int]
) -> int:
    """_check_hashing's step for an opcode dumps seldom hold: its effect on the weights; the next
    opcode's offset.
    """
    if op == 0x8D or op == 0x8E or op == 0x96:  # 8-byte lengths
        stack.append(0)
        return pos + 9 + int.from_bytes(data[pos + 1:pos + 9], "little")
    if op == 0x8B:  # LONG4
        stack.append(0)
        return pos + 5 + int.from_bytes(data[pos + 1:pos + 5], "little")
    if op == 0x6C:  # LIST
        del stack[marks.pop() if marks else 0:]
        stack.append(0)
    elif op == 0x32:  # DUP
        stack.append(stack[-1] if stack else 0)
    elif op == 0x30:  # POP (of the MARK itself when nothing is above it, as the C unpickler does)
        if marks and marks[-1] == len(stack):
            marks.pop()
        else:
            del stack[-1:]
    elif op == 0x52:  # REDUCE (an admitted helper: it bounds its own argument)
        del stack[-2:]
        stack.append(0)
    elif op == 0x80 or op == 0x95:  # PROTO, FRAME
        return pos + 1 + _ARG_WIDTH[op]
    elif op == 0x63:  # GLOBAL
        stack.append(0)
        return data.index(b"\n", data.index(b"\n", pos + 1) + 1) + 1
    elif op in _TEXT_OPS:  # text arguments: a value, or a memo index
        stop = data.index(b"\n", pos + 1)
        if op == 0x70:  # PUT
            if stack:
                memo[int(data[pos + 1:stop])] = stack[-1]
        elif op == 0x67:  # GET
            stack.append(memo.get(int(data[pos + 1:stop]), 0))
        else:
            stack.append(0)
        return stop + 1
    else:
        raise PickleLoadError(f"invalid opcode 0x{op:02x} at offset {pos}")
    return pos + 1
