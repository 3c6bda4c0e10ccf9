"""`sia bench isolation` at its smallest: level none, one repetition, real workers
on emulated GPUs. Only the JSON's shape is checked, never a time."""

from __future__ import annotations

import json

import pytest

from sia_grpc.bench.isolation import METRICS, percentile
from sia_grpc.cli import main

pytestmark = [pytest.mark.timeout(180), pytest.mark.xdist_group("heavy")]


def test_bench_isolation_json_shape(capsys):
    assert main(["bench", "isolation", "--levels", "none", "--repeats", "1",
                 "--steady", "1", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert {"cpus", "python", "kernel", "loadavg_before"} <= res["machine"].keys()
    assert res["config"]["repeats"] == 1
    assert list(res["levels"]) == ["none"]
    none = res["levels"]["none"]
    assert none["status"] == "measured" and none["trial_s"] >= 0
    s = none["samples"]
    # one start, one resize, two stops (the resize's and the last), 5 bare process starts,
    # an enter and a leave per run (2 generations + 5 bare starts: leave_now is not timed)
    assert (len(s["start_s"]), len(s["resize_s"]), len(s["stop_s"])) == (1, 1, 2)
    assert len(s["spawn_ms"]) == 5 and len(s["enter_ms"]) == 7 and len(s["leave_ms"]) == 2
    assert all(v > 0 for k in ("start_s", "resize_s", "stop_s") for v in s[k])
    for k in METRICS:
        m = none["summary"][k]
        assert {"p50", "p95", "n", "ratio_p50", "ratio_paired"} <= m.keys()
        if m["n"]:
            assert m["ratio_p50"] == pytest.approx(1.0)
            assert m["ratio_paired"] == pytest.approx(1.0)


def test_bench_isolation_rejects_unknown_levels(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "isolation", "--levels", "none,strict"])
    assert "--levels" in capsys.readouterr().err


def test_percentile():
    assert percentile([], 50) is None
    assert percentile([3.0], 95) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 50) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 95) == pytest.approx(4.8)
