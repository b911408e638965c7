"""Pass 1 of the hang analysis run on a dump set's chunks while the reader builds them.

On 2 cores the reader leaves part of the CPU idle (its threads wait on each other and on the GIL:
~15% at 16,384 ranks), and pass 1 (decode, signatures, aggregates: ~4 s there) fills it. The stream
is read_dump_dir's on_chunk callback: each chunk is queued (the reader never waits on it) and a
thread of its own decodes it and adds it to pass 1 (pass_one.PassOneRun). analyze_collectives(table,
first_pass=stream) then takes what it gathered, where the chunks it saw are exactly the table's
slices; otherwise (the reader split the files over processes, chunks cut differently, anything
failed) pass 1 runs on the table as usual: the stream only ever saves time.
"""

from __future__ import annotations

import logging
import queue
import threading

import pyarrow as pa

from faultlens.attribution.detectors.hang.decode import SliceDecoder
from faultlens.attribution.detectors.hang.pass_one import PassOne, PassOneRun, configured_from_table

log = logging.getLogger(__name__)

_DONE = None  # queued after the last chunk


class PassOneStream:
    """Call it with (first row, chunk, share of the files read) for each chunk as it is read; then
    take(table) (or close())."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[int, pa.Table, float] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._decoder = SliceDecoder(pa.table({}))
        self._run = PassOneRun(self._decoder, 0)
        self._spans: list[tuple[int, int]] = []
        self._result: PassOne | None = None
        self._failed = False
        # whether take() gave its result (the analysis then skipped its own pass 1)
        self.used = False

    def __call__(self, start: int, chunk: pa.Table, share: float = 0.0) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._work, name="hang-pass-one-stream", daemon=True
            )
            self._thread.start()
        self._queue.put((start, chunk, share))

    def _work(self) -> None:
        done = False
        try:
            while (item := self._queue.get()) is not _DONE:
                start, chunk, share = item
                part = self._decoder.noted(self._decoder.decode_part(chunk, start))
                self._spans.append((start, start + chunk.num_rows))
                # the set's rows projected from the share read: its signature table sized once
                if share > 0:
                    self._run.out.signatures.rows_total = int((start + chunk.num_rows) / share)
                self._run.add(part, chunk, 0)
            done = True
            self._result = self._run.finish()
        except Exception:  # pass 1 then runs on the table
            log.debug(
                "hang pass 1 on the read's chunks failed; it runs on the table", exc_info=True
            )
            self._failed = True
            while not done and self._queue.get() is not _DONE:  # the rest drained, not decoded
                pass
        finally:
            self._run.close()

    def _stop(self) -> None:
        if self._thread is not None:
            self._queue.put(_DONE)
            self._thread.join()
            self._thread = None

    def close(self) -> None:
        """Stop the thread (what it gathered is dropped)."""
        self._stop()
        self._failed = True

    def take(self, table: pa.Table) -> tuple[PassOne, SliceDecoder] | None:
        """Pass 1's result and its decoder (now on `table`) where the chunks seen are the table's
        slices, else None (the caller runs pass 1 itself)."""
        self._stop()
        if self._failed or self._result is None:
            return None
        decoder = self._decoder
        decoder.table = table
        if self._spans != decoder.bounds() or not self._spans:
            log.debug("hang pass 1: the read's chunks are not the table's slices; it runs on the "
                      "table")
            return None
        try:
            configured_from_table(self._result, table, decoder)
        except Exception:
            log.debug(
                "hang pass 1: the table's pg_ranks unreadable; pass 1 runs on the table",
                exc_info=True,
            )
            return None
        self.used = True
        return self._result, decoder

