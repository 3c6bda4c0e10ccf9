"""What every dashboard page shares: the colours (a job's, a GPU type's), the link to a
job's page, and how a time is written."""

from __future__ import annotations

import datetime
import zlib
from collections.abc import Iterable
from html import escape
from urllib.parse import quote


def job_href(job_id: str) -> str:
    """The job page's link: an id may hold '/' (`tenant/name`), one path segment."""
    return "/jobs/" + escape(quote(job_id, safe=""))


# Okabe & Ito's palette (less black): told apart with each common colour-vision
# deficiency. Each colour comes with the text colour that reads on it.
PALETTE = [("#E69F00", "#000"), ("#56B4E9", "#000"), ("#009E73", "#fff"),
           ("#F0E442", "#000"), ("#0072B2", "#fff"), ("#D55E00", "#fff"),
           ("#CC79A7", "#000")]


def job_colour(job_id: str) -> tuple[str, str]:
    """A job's colour (and its text's): the same on every page and every restart."""
    return PALETTE[zlib.crc32(job_id.encode()) % len(PALETTE)]


def type_colours(types: Iterable[str]) -> dict[str, str]:
    """A colour per GPU type, by name order (so a type keeps its colour as jobs come
    and go, as long as the cluster's types stay the same)."""
    return {t: PALETTE[i % len(PALETTE)][0] for i, t in enumerate(sorted(set(types)))}


def utc(at: float) -> str:
    """Seconds since the epoch as "2026-01-05 09:30:00Z"; "-" for 0."""
    if not at:
        return "-"
    when = datetime.datetime.fromtimestamp(at, datetime.UTC).replace(microsecond=0)
    return when.replace(tzinfo=None).isoformat(sep=" ") + "Z"
