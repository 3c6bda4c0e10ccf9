"""What the controller commands print with `-o`, shared by the job commands
(`cli/jobs.py`) and the cluster views (`cli/cluster.py`).

`-o json` (and `-o yaml`, the same document) is the proto3 JSON mapping of the
messages (`google.protobuf.json_format`, field names as in the .proto files, every
field present), so scripts read exactly what `grpcurl` would show:
`ls` -> {"jobs": [Job, ...]}, `get` -> Job, `cluster` -> {"cluster": Cluster,
"rounds": [Round, ...]}, `queues` -> ListQueuesResponse (docs/operations.md,
"Scripting with -o json").
"""

from __future__ import annotations

import json
from typing import Any

import yaml
from google.protobuf import json_format

from sia_grpc.client.sdk import JobView


def output_flag(p: Any, default: str) -> None:
    """-o/--output json, yaml or wide; `default`: what is printed without it."""
    p.add_argument("-o", "--output", choices=("json", "yaml", "wide"), default=None,
                   help=f"json or yaml: the proto3 JSON mapping, for scripts "
                        f"(docs/operations.md); wide: more columns (default: {default})")


def message_to_data(msg: Any) -> dict[str, Any]:
    """The proto3 JSON mapping of a message (an SDK view: of its message), with the
    .proto's field names and every field present: what `-o json` prints."""
    return json_format.MessageToDict(msg.proto if isinstance(msg, JobView) else msg,
                                     preserving_proto_field_name=True,
                                     always_print_fields_with_no_presence=True)


def dump(data: Any, output: str) -> str:
    """`data` as `-o json` or `-o yaml` prints it."""
    if output == "json":
        return json.dumps(data, indent=2, ensure_ascii=False)
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True).rstrip("\n")
