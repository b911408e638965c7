"""The accounting's buckets (where wall time went) and their priority where definitions overlap."""

from __future__ import annotations

from enum import StrEnum

from faultlens.errors import FaultlensError


class GoodputError(ValueError, FaultlensError):
    """The job cannot be accounted (no telemetry for it, or an empty window): the message says
    which.
    """


class Bucket(StrEnum):
    PRODUCTIVE = "productive"
    CHECKPOINT = "checkpoint"
    LOST_WORK = "lost_work"
    STARTUP = "startup"
    RESTART = "restart"
    DECISION = "decision"
    DETECTION = "detection"
    UNKNOWN = "unknown"  # the unproductive remainder: covered by no other bucket


# the bucket that wins where several definitions cover the same instant; UNKNOWN is what is left
PRIORITY: tuple[Bucket, ...] = (
    Bucket.CHECKPOINT,
    Bucket.LOST_WORK,
    Bucket.PRODUCTIVE,
    Bucket.STARTUP,
    Bucket.RESTART,
    Bucket.DECISION,
    Bucket.DETECTION,
)
BUCKETS: tuple[Bucket, ...] = (*PRIORITY, Bucket.UNKNOWN)
BADPUT: tuple[Bucket, ...] = tuple(b for b in BUCKETS if b is not Bucket.PRODUCTIVE)


