"""Python stacks of the ranks carried in the table's schema metadata (dump requester -> analysis).
"""

from collections.abc import Mapping
from typing import Any

import pyarrow as pa

STACKS_METADATA_KEY = b"faultlens.stacks"


def attach_stacks(table: pa.Table, stacks: Mapping[int, Any]) -> pa.Table:
    """The table with the ranks' Python stacks (faultlens.collectors.sources.pystack.ProcessStack)
    in its schema metadata, so that a dump requester can hand them to the analysis together with the
    rows."""
    import json

    from faultlens.collectors.sources.pystack import stack_to_json

    if not stacks:
        return table
    metadata = dict(table.schema.metadata or {})
    metadata[STACKS_METADATA_KEY] = json.dumps(
        {str(int(r)): stack_to_json(s) for r, s in stacks.items()}
    ).encode()
    return table.replace_schema_metadata(metadata)


def stacks_from_metadata(table: pa.Table) -> dict[int, Any]:
    import json

    from faultlens.collectors.sources.pystack import parse_py_spy

    raw = (table.schema.metadata or {}).get(STACKS_METADATA_KEY)
    if not raw:
        return {}
    try:
        document = json.loads(raw)
    except ValueError:
        return {}
    if not isinstance(document, dict):
        return {}
    return {int(r): parse_py_spy(v, source=f"stack of rank {r}") for r, v in document.items()
            if str(r).lstrip("-").isdigit()}

