"""The example scripts run to their target alone, and their loss falls."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from train_support import clean_environ


@pytest.mark.timeout(90)
@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_example_trains(name, tmp_path):
    proc = subprocess.run([sys.executable, "-m", f"sia_grpc.train.examples.{name}"],
                          env=clean_environ(), capture_output=True, text=True, timeout=80,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    losses = [float(x) for x in re.findall(r"loss ([0-9.]+)", proc.stdout)]
    accuracy = [float(x) for x in re.findall(r"accuracy ([0-9.]+)", proc.stdout)]
    assert len(losses) >= 3 and losses[-1] < 0.7 * losses[0], proc.stdout
    assert accuracy[-1] > 0.85, proc.stdout
    assert "progress 1.00" in proc.stdout.splitlines()[-1]
