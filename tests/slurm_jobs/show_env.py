"""Writes the faultlens identity and restore variables a rank sees to $ENV_FILE.<rank> (JSON)."""

import json
import os

names = [
    "FAULTLENS_JOB_ID",
    "FAULTLENS_ATTEMPT",
    "FAULTLENS_NODE",
    "FAULTLENS_RESTORE_TIER",
    "FAULTLENS_RESTORE_STEP",
    "FAULTLENS_RESTORE_URI",
    "FAULTLENS_RESTORE_DECISION",
]
with open(f"{os.environ['ENV_FILE']}.{os.environ['RANK']}", "w") as out:
    json.dump({name: os.environ.get(name) for name in names}, out)
