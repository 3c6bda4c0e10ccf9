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
