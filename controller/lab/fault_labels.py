"""Ground-truth labels of injected faults: the contract between the cluster simulator (which writes
them) and the evaluator (which scores incidents against them).

One JSON object per line. A label is kept OUT of the store on purpose: nothing the engine reads may
say which rank is guilty. Benign noise injected to provoke false alarms is labelled too (class
"benign", expected action "none"), so the evaluator can say which kind of noise a false alarm came
from.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, TextIO

from faultlens.errors import FaultlensError

LABELS_FORMAT = "faultlens.labels/1"


class LabelClass(StrEnum):
    CRASH = "crash"
    COLLECTIVE_HANG = "collective_hang"
    STRAGGLER = "straggler"
    HEALTH = "health"
    NUMERICS = "numerics"
    BENIGN = "benign"
    UNKNOWN = "unknown"


class ExpectedAction(StrEnum):
    FAILOVER = "failover"
    ESCALATE = "escalate"
    DRAIN = "drain"
    NONE = "none"  # benign noise: nothing must happen
    UNKNOWN = "unknown"


class LabelError(ValueError, FaultlensError):
    """A labels file cannot be read: the message names the file, the line and the problem."""


@dataclass(frozen=True)
class FaultLabel:
    """One injected fault (or one piece of benign noise) and what a correct system would conclude.
    """

    fault_id: str
    kind: str  # simulator fault kind, e.g. "gpu_xid79", "hbm_dbe", "software_bug"
    # the Llama 3 table row it stands for ("Faulty GPU", "Software Bug", ...) or
    # "Straggler"/"Benign"
    category: str
    label_class: LabelClass
    cause: str  # a faultlens.attribution.incident.Cause value
    expected_action: ExpectedAction
    injected_ts: dt.datetime  # when the fault happened (simulated time, UTC)
    effect_end_ts: dt.datetime  # when its effect on the job ended (restart, straggler over)
    job_id: str | None = None
    attempt: int | None = None
    step: int | None = None
    culprit_nodes: tuple[str, ...] = ()
    culprit_ranks: tuple[int, ...] = ()
    culprit_gpus: tuple[str, ...] = ()
    repeat_of: str | None = None  # a deterministic software bug hitting again after a restart
    # when the fault's first symptoms began, if before injected_ts
    onset_ts: dt.datetime | None = None
    notes: str = ""
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def is_fault(self) -> bool:
        return self.label_class is not LabelClass.BENIGN

    @property
    def window_start(self) -> dt.datetime:
        return min(self.injected_ts, self.onset_ts) if self.onset_ts else self.injected_ts

    def to_json(self) -> dict[str, Any]:
        row = asdict(self)
        row["format"] = LABELS_FORMAT
        row["class"] = self.label_class.value
        del row["label_class"]
        row["expected_action"] = self.expected_action.value
        row["injected_ts"] = self.injected_ts.isoformat()
        row["effect_end_ts"] = self.effect_end_ts.isoformat()
        row["onset_ts"] = self.onset_ts.isoformat() if self.onset_ts else None
        row["culprit_nodes"] = list(self.culprit_nodes)
        row["culprit_ranks"] = list(self.culprit_ranks)
        row["culprit_gpus"] = list(self.culprit_gpus)
        return row

    @classmethod
    def from_json(cls, row: dict[str, Any], where: str = "label") -> FaultLabel:
        def need(key: str) -> Any:
            if key not in row or row[key] is None:
                raise LabelError(f"{where}: key {key!r} is required")
            return row[key]

        def ts(key: str) -> dt.datetime:
            value = need(key)
            try:
                parsed = dt.datetime.fromisoformat(str(value))
            except ValueError:
                raise LabelError(f"{where}: key {key!r}: expected an ISO-8601 timestamp, got "
                                 f"{value!r}") from None
            if parsed.tzinfo is None:
                raise LabelError(f"{where}: key {key!r}: expected a timestamp with a time zone, "
                                 f"got {value!r}")
            return parsed.astimezone(dt.UTC)

        def enum(enum_type: type[StrEnum], key: str) -> Any:
            value = need(key)
            try:
                return enum_type(value)
            except ValueError:
                allowed = ", ".join(e.value for e in enum_type)
                raise LabelError(
                    f"{where}: key {key!r}: expected one of {allowed}, got {value!r}"
                ) from None

        def str_list(key: str) -> tuple[str, ...]:
            value = row.get(key) or []
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise LabelError(f"{where}: key {key!r}: expected a list of strings")
            return tuple(value)

        ranks = row.get("culprit_ranks") or []
        if not isinstance(ranks, list) or not all(isinstance(v, int) for v in ranks):
            raise LabelError(f"{where}: key 'culprit_ranks': expected a list of integers")
        fmt = row.get("format", LABELS_FORMAT)
        if fmt != LABELS_FORMAT:
            raise LabelError(f"{where}: key 'format': expected {LABELS_FORMAT!r}, got {fmt!r}")
        return cls(
            fault_id=str(need("fault_id")),
            kind=str(need("kind")),
            category=str(row.get("category") or ""),
            label_class=enum(LabelClass, "class"),
            cause=str(need("cause")),
            expected_action=enum(ExpectedAction, "expected_action"),
            injected_ts=ts("injected_ts"),
            effect_end_ts=ts("effect_end_ts"),
            job_id=row.get("job_id"),
            attempt=row.get("attempt"),
            step=row.get("step"),
            culprit_nodes=str_list("culprit_nodes"),
            culprit_ranks=tuple(ranks),
            culprit_gpus=str_list("culprit_gpus"),
            repeat_of=row.get("repeat_of"),
            onset_ts=ts("onset_ts") if row.get("onset_ts") else None,
            notes=str(row.get("notes") or ""),
            extra=dict(row.get("extra") or {}),
        )


def write_labels(labels: Iterable[FaultLabel], out: str | Path | TextIO) -> int:
    """Write labels as JSON lines; returns how many."""
    if isinstance(out, (str, Path)):
        with open(out, "w", encoding="utf-8") as handle:
            return write_labels(labels, handle)
    count = 0
    for label in labels:
        out.write(json.dumps(label.to_json(), sort_keys=True) + "\n")
        count += 1
    return count


def read_labels(path: str | Path) -> list[FaultLabel]:
    """Read a labels file; a bad line raises LabelError naming the file, the line number and the
    problem.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise LabelError(f"{path}: cannot read labels: {exc.strerror or exc}") from None
    labels: list[FaultLabel] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise LabelError(f"{where}: not JSON: {exc.msg}") from None
        if not isinstance(row, dict):
            raise LabelError(f"{where}: expected a JSON object, got {type(row).__name__}")
        labels.append(FaultLabel.from_json(row, where))
    return labels


def faults_only(labels: Sequence[FaultLabel]) -> list[FaultLabel]:
    return [label for label in labels if label.is_fault]
