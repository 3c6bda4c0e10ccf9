"""`sia bench sim` on a tiny trace: its table, and `--scale` (the scalability study's
largest runs are timed on hetero64 × 32)."""

from __future__ import annotations

import pytest

from sia_grpc.cli import main

# `trace`: tests/sim/conftest.py's three-job trace.

def _row(out: str) -> list[str]:
    lines = [line for line in out.splitlines() if line.startswith("| ")]
    assert lines[0].startswith("| workload | jobs | GPUs | rounds |")
    return [c.strip() for c in lines[1].strip("|").split("|")]


@pytest.mark.parametrize(("args", "gpus"), [([], "64"), (["--scale", "2"], "128")])
def test_bench_sim_scales_the_cluster(trace, capsys, args, gpus):
    assert main(["bench", "sim", str(trace), "--policy", "fifo", *args]) == 0
    captured = capsys.readouterr()
    row = _row(captured.out)
    assert row[:3] == [str(trace), "3", gpus]
    assert f"on hetero64x{args[-1] if args else 1}" in captured.err


def test_bench_sim_bad_scale(trace, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bench", "sim", str(trace), "--scale", "0"])
    assert exc.value.code == 2
    assert "--scale: must be positive" in capsys.readouterr().err
