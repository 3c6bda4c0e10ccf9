"""`backend`: each store back-end in turn (store_backends.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from store_backends import Backend, Postgres, Sqlite


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request, tmp_path: Path) -> Backend:
    if request.param == "sqlite":
        return Sqlite(tmp_path / "sia.db")
    return Postgres(request.getfixturevalue("postgres_dsn"))
