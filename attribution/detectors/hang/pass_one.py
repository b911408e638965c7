"""Pass 1 of the hang analysis: progress per (group, rank), row signatures per (group, seq) and
membership evidence, gathered slice by slice into PassOne. analyze_collectives runs it over the
table's slices (run_pass_one); PassOneStream (stream.py) runs the same PassOneRun on the reader's
chunks while they are read, and the analysis takes its result. Both import it from here: neither
imports the other for it."""

from collections import Counter, defaultdict, deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from faultlens.attribution.detectors.hang.aggregate import ProgressTable, SignatureTable
from faultlens.attribution.detectors.hang.columns import take_rows, valid_rows, validity
from faultlens.attribution.detectors.hang.decode import DecodedSlice, SliceDecoder, present_codes
from faultlens.attribution.detectors.hang.details import signature_columns, slice_signatures
from faultlens.attribution.detectors.hang.report import SIGNATURE_COLUMNS


@dataclass
class PassOne:
    """What pass 1 gathers over the table's slices."""

    dumped: set[int] = field(default_factory=set)
    progress: ProgressTable = field(default_factory=ProgressTable)
    signatures: SignatureTable = field(default_factory=SignatureTable)
    configured: dict[int, Counter] = field(default_factory=lambda: defaultdict(Counter))
    p2p_rows: list[np.ndarray] = field(default_factory=list)


class PassOneRun:
    """Pass 1 slice by slice: progress per (group, rank), signatures per (group, seq), membership
    evidence. Each slice is decoded by the caller; its row signatures are computed on a second
    thread and added to the aggregates (aggregate.py) on a third, in the slices' order, while the
    next slice is decoded (the compiled kernels release the GIL). close() in any case."""

    def __init__(self, decoder: SliceDecoder, rows_hint: int) -> None:
        self.decoder = decoder
        self.out = PassOne(signatures=SignatureTable(rows_hint))
        self._signing = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hang-signatures")
        self._adding = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hang-pass-one")
        self._pending: deque[Future[None]] = deque()

    def add(self, part: DecodedSlice, source: pa.Table, at: int) -> None:
        """A decoded slice, whose rows start at row `at` of `source` (the table, or a chunk of
        it)."""
        out, decoder, n = self.out, self.decoder, len(part.rank)
        out.dumped.update(present_codes(part.rank).tolist())
        desc = decoder.descs.codes(source.column("pg_desc").slice(at, n), n) \
            if "pg_desc" in source.column_names else np.full(n, -1, np.int32)
        if "pg_ranks" in source.column_names:
            _add_configured(out, part, source.column("pg_ranks").slice(at, n))
        out.p2p_rows.append(np.nonzero(part.p2p)[0] + part.start)
        # the op names decoded so far (the next slice's decode may add some)
        ops = list(decoder.ops.values)
        coll_rows = np.nonzero(part.coll)[0]
        columns = signature_columns(source)
        signed = self._signing.submit(slice_signatures, part, coll_rows, columns, ops, at)
        self._pending.append(self._adding.submit(_add_slice, out, part, desc, coll_rows, signed))
        # at most one slice aggregated while the next is decoded: bounded memory
        while len(self._pending) > 1:
            self._pending.popleft().result()

    def finish(self) -> PassOne:
        while self._pending:
            self._pending.popleft().result()
        return self.out

    def close(self) -> None:
        self._signing.shutdown(cancel_futures=True)
        self._adding.shutdown(cancel_futures=True)


def _add_configured(out: PassOne, part: DecodedSlice,
                    pg_ranks: pa.ChunkedArray | pa.Array) -> None:
    """Membership from the rows of a slice that carry pg_ranks (a group's config), by their
    group."""
    rows = np.nonzero(validity(pg_ranks) & (part.group >= 0))[0]
    if rows.shape[0]:
        for row, value in zip(rows, take_rows(pg_ranks, rows).to_pylist(), strict=True):
            if value:
                out.configured[int(part.group[row])][tuple(sorted(int(v) for v in value))] += 1


def run_pass_one(table: pa.Table, decoder: SliceDecoder) -> PassOne:
    """Pass 1 over the table's slices (PassOneRun)."""
    run = PassOneRun(decoder, table.num_rows)
    try:
        for part in decoder.slices():
            run.add(part, table, part.start)
        return run.finish()
    finally:
        run.close()


def configured_from_table(out: PassOne, table: pa.Table, decoder: SliceDecoder) -> None:
    """Membership from the table's pg_ranks rows, when pass 1 ran on chunks that lacked the column
    (the reader builds it last): only those rows (a few per group) are taken and decoded."""
    if "pg_ranks" not in table.column_names:
        return
    rows = valid_rows(table.column("pg_ranks"))
    if rows.shape[0] == 0:
        return
    columns = [c for c in table.column_names if c not in SIGNATURE_COLUMNS]
    taken = take_rows(table.select(columns), rows)
    _add_configured(out, decoder.decode_part(taken, -1), taken.column("pg_ranks"))


def _add_slice(out: PassOne, part: DecodedSlice, desc: np.ndarray, coll_rows: np.ndarray,
               signed: Future[np.ndarray]) -> None:
    """One slice into the pass-1 aggregates (one thread at a time: the pool has one worker), its
    signatures once they are computed."""
    out.progress.add(part.group, part.rank, part.seq, part.coll, part.complete, part.started, desc)
    out.signatures.add(coll_rows, part.group, part.seq, signed.result(), len(part.rank))
