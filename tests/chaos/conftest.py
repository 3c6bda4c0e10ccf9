"""The chaos tests reuse the controller tests' harness (tests/controller/harness.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "controller"))
