"""Names of things (job ids, tenants, nodes, GPU types, labels): one pattern.

A name is 1+ of [A-Za-z0-9._-], starting with a letter or digit; ids and tenants
are at most 63 characters (a DNS label's length).
"""

from __future__ import annotations

import re

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
MAX_ID = 63


def is_name(text: str, max_len: int | None = None) -> bool:
    """Whether `text` is a name (of at most `max_len` characters, if given)."""
    return bool(NAME.match(text)) and (max_len is None or len(text) <= max_len)


def scoped_job_id(tenant: str, name: str) -> str:
    """A job's id in the controller: the name its tenant gave it, scoped by the tenant
    (`team-a/train-1`), so that two tenants may each have a `train-1` and no answer
    says whether another tenant holds a name. A job with no tenant keeps its name.
    Names have no `/`, so the scoped id is unambiguous."""
    return f"{tenant}/{name}" if tenant else name


def job_key(tenant: str, job_id: str, job_uid: str) -> str:
    """What a job's files are keyed by, on the nodes and in the checkpoint root:
    `<tenant>/<uid>`, the server-assigned uid that no later job gets (a job id may
    be reused after a delete, and two tenants may name jobs alike); a job created
    before uids were assigned falls back to its id. `_` stands for no tenant."""
    return f"{tenant or '_'}/{job_uid or job_id}"


def job_checkpoint_path(checkpoint_root: str, tenant: str, job_id: str, job_uid: str) -> str:
    """The checkpoint directory of a job under `checkpoint_root` (`job_key`)."""
    return f"{checkpoint_root.rstrip('/')}/{job_key(tenant, job_id, job_uid)}"
