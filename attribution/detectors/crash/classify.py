"""Row and rank level: which process_events rows are failures, which of them echo someone else's,
what each rank went through (one RankFailure per rank), and which rank failed first on its own."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pandas as pd

from faultlens.attribution.detectors.crash.failures import (
    FAILURE_KINDS,
    PRIMARY_KINDS,
    FailureKind,
    RankFailure,
)
from faultlens.attribution.detectors.crash.lifecycle import (
    in_teardown,
    stamped_in_whole_seconds,
)
from faultlens.attribution.detectors.crash.rows import (
    describe_process_event,
    row_value,
    signal_from_code,
    signal_identity,
    text_matches,
)
from faultlens.attribution.hardware import as_datetime
from faultlens.attribution.incident import Evidence
from faultlens.attribution.rules import CrashRules, any_of


class FailureClassifier:
    """The row and rank level of crash attribution (vectorised over the rows), by the rules'
    patterns.
    """

    def __init__(self, rules: CrashRules) -> None:
        self.rules = rules
        self._secondary_re = any_of(rules.secondary_patterns)
        self._timeout_re = any_of(rules.timeout_patterns)
        self._termination_re = any_of(rules.termination_patterns)
        self._mismatch_re = any_of(rules.mismatch_patterns)

    # ------------------------------------------------------------ row level (vectorised)

    def classify(self, events: pd.DataFrame) -> pd.DataFrame:
        """The failure rows of `events`, with columns _signal, _secondary, _timeout, _text added."""
        if events.empty:
            return events.assign(_signal=pd.Series(dtype=object), _secondary=pd.Series(dtype=bool),
                                 _timeout=pd.Series(dtype=bool), _text=pd.Series(dtype=object),
                                 _terminated=pd.Series(dtype=bool))
        def column(name: str) -> pd.Series:
            if name in events.columns:
                values = events[name].astype(object)
                return values.where(values.notna(), None)
            return pd.Series(None, index=events.index, dtype=object)

        kind = column("kind")
        exit_code = pd.to_numeric(column("exit_code"), errors="coerce")
        named = column("signal").map(lambda s: None if s is None or pd.isna(s) or not str(s) else (
            str(s).upper() if str(s).upper().startswith("SIG") else f"SIG{str(s).upper()}"))
        from_code = pd.Series(
            [signal_from_code(c, k)
             for c, k in zip(exit_code.to_numpy(), kind.to_numpy(), strict=True)],
            index=events.index, dtype=object)
        signal = named.where(named.notna(), from_code)
        text = (column("message").fillna("") + "\n" + column("traceback").fillna("")).str.strip()
        flagged = column("is_secondary").fillna(False).astype(bool)
        echo = text_matches(text, self._secondary_re)
        terminated = (
            text_matches(text, self._termination_re)
            | (kind.isin(["exit", "signal"]) & signal.isin(self.rules.termination_signals))
            | in_teardown(events, signal)
        )
        secondary = flagged | (kind == "watchdog_timeout") | echo | terminated
        timeout = (kind == "watchdog_timeout") | text_matches(text, self._timeout_re)
        failure = kind.isin(FAILURE_KINDS) & (
            (kind != "exit") | (exit_code.fillna(0) != 0) | signal.notna()
        )
        frame = events.assign(
            _signal=signal,
            _secondary=secondary.astype(bool),
            _timeout=timeout.astype(bool),
            _text=text,
            _terminated=terminated.astype(bool),
        )
        return frame[failure.to_numpy(dtype=bool)]

    def is_secondary(self, row: Any) -> bool:
        return bool(self.classify(pd.DataFrame([dict(row)]))["_secondary"].any())

    # ------------------------------------------------------------ rank level

    def rank_failures(self, rows: pd.DataFrame) -> list[RankFailure]:
        """One RankFailure per rank of one attempt's classified failure rows (see classify)."""
        rows = rows.sort_values("ts", kind="stable")
        rank_key = rows["rank"].astype(object).where(rows["rank"].notna(), -1)
        kind = rows["kind"].astype(object)
        primary_row = ~rows["_secondary"]
        marks = pd.DataFrame({
            "rank": rank_key,
            "oom": (kind == "oom") & primary_row,
            "exception": kind.isin(["exception", "comm_error"]) & primary_row,
            "killed": rows["_signal"].isin(self.rules.primary_signals),
            "terminated": rows["_terminated"],
            "echo": rows["_secondary"] & (rows["_text"] != "") & ~rows["_terminated"],
            "secondary": rows["_secondary"],
            "primary": primary_row,
            "timeout": rows["_timeout"],
        }, index=rows.index)
        per_rank = marks.groupby("rank", sort=True)
        anys = per_rank[
            ["oom", "exception", "killed", "terminated", "echo", "secondary", "primary"]
        ].any()
        counts = per_rank.agg(rows_=("secondary", "size"), secondary_=("secondary", "sum"),
                              timeout_=("timeout", "sum"))
        # rank -> its rows' positions, in time order (one pass, not one per rank)
        positions = per_rank.indices
        failures = []
        for rank, flags in anys.iterrows():
            if flags["oom"]:
                kind_of, column = FailureKind.OOM, "oom"
            elif flags["exception"]:
                kind_of, column = FailureKind.EXCEPTION, "exception"
            elif flags["killed"]:
                # SIGKILL after a SIGTERM is the supervisor's; a survivor that echoed a peer's
                # failure and was then killed is a survivor
                kind_of = FailureKind.TERMINATED if flags["terminated"] else (
                    FailureKind.SECONDARY if flags["echo"] else FailureKind.KILLED)
                column = "killed"
            elif flags["terminated"] and not flags["echo"]:
                kind_of, column = FailureKind.TERMINATED, "terminated"
            elif flags["echo"]:
                kind_of, column = FailureKind.SECONDARY, "echo"
            elif flags["secondary"]:
                kind_of, column = FailureKind.TERMINATED, "secondary"
            else:
                kind_of, column = FailureKind.EXITED, "primary"
            mine = positions[rank]
            chosen = int(mine[marks[column].to_numpy(dtype=bool)[mine]][0])
            failures.append(
                self._rank_failure(rows.iloc[mine], rows.iloc[chosen], kind_of, counts.loc[rank])
            )
        return failures

    def _rank_failure(self, own: pd.DataFrame, chosen: pd.Series, kind: FailureKind,
                      counts: pd.Series) -> RankFailure:
        """One rank's failure from its own rows (`own`, in time order) and the row that says what it
        was.
        """
        rank = row_value(chosen, "rank")
        node = (
            next((n for n in own["node"] if isinstance(n, str) and n), None)
            if "node" in own.columns
            else None
        )
        details = own[own["kind"].isin(["exception", "comm_error", "oom"]) & ~own["_secondary"]]
        if details.empty:
            details = own

        def first(column: str) -> Any:
            if column not in details.columns:
                return None
            return next((v for v in details[column] if isinstance(v, str) and v), None)

        step_values = own["step"].dropna() if "step" in own.columns else pd.Series(dtype=float)
        exits = own[own["kind"] == "exit"]
        exit_code = row_value(exits.iloc[0], "exit_code") if not exits.empty else None
        ts = as_datetime(chosen["ts"])
        if ts is None:
            raise ValueError(f"process_events: rank {rank}: a failure row without ts")
        shown = own[~own["_secondary"]] if kind in (*PRIMARY_KINDS, FailureKind.EXITED) else own
        timeouts = own.loc[own["_timeout"], "ts"]
        return RankFailure(
            rank=int(rank) if rank is not None else None,
            node=node,
            kind=kind,
            ts=ts,
            signal=row_value(chosen, "_signal"),
            exit_code=int(exit_code) if exit_code is not None else None,
            exception_type=first("exception_type"),
            message=first("message"),
            traceback=first("traceback"),
            fingerprint=first("fingerprint")
            if kind in (FailureKind.EXCEPTION, FailureKind.OOM)
            else (
                signal_identity(row_value(chosen, "_signal"), rank)
                if kind == FailureKind.KILLED
                else None
            ),
            step=int(step_values.iloc[0]) if not step_values.empty else None,
            rows=int(counts["rows_"]),
            secondary_rows=int(counts["secondary_"]),
            timeout_rows=int(counts["timeout_"]),
            first_timeout=as_datetime(timeouts.min()) if not timeouts.empty else None,
            whole_second=stamped_in_whole_seconds(row_value(chosen, "source"), chosen["ts"]),
            evidence=tuple(
                Evidence("process_events", as_datetime(row["ts"]), describe_process_event(row))
                for _, row in shown.head(3).iterrows()
            ),
        )

    def primary(self, failures: list[RankFailure]) -> RankFailure | None:
        """The failure that came first on its own: exceptions/OOMs and deaths by signal (the latter
        stamped late by the supervisor, so moved earlier by the notice slack), else an unexplained
        non-zero exit."""
        slack = dt.timedelta(seconds=self.rules.signal_notice_slack_s)
        strong = [f for f in failures if f.kind in PRIMARY_KINDS]
        if strong:
            return min(
                strong,
                key=lambda f: (
                    f.ts - slack if f.kind == FailureKind.KILLED else f.ts,
                    f.rank if f.rank is not None else -1,
                ),
            )
        weak = [f for f in failures if f.kind == FailureKind.EXITED]
        if weak:
            return min(weak, key=lambda f: (f.ts, f.rank if f.rank is not None else -1))
        return None
