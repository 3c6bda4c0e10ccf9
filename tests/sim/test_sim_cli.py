"""`sia simulate` end to end on a tiny trace, and its error messages."""

from __future__ import annotations

import json

import pytest

from sia_grpc.cli import main

TRACE = """name,time,application,num_replicas,batch_size
j0,0,ncf,1,256
j1,30,cifar10,2,256
j2,90,ncf,1,512
"""


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "tiny.csv"
    path.write_text(TRACE)
    return path


def test_simulate_two_policies(trace, tmp_path, capsys):
    out = tmp_path / "runs.json"
    rc = main(["simulate", str(trace), "--policy", "sia,fifo", "--jobs", "1",
               "--json", str(out)])
    captured = capsys.readouterr()
    assert rc == 0, captured.err

    lines = captured.out.splitlines()
    assert lines[0].split()[:3] == ["name", "jobs", "done"]
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    assert set(rows) == {"sia", "fifo"}
    for row in rows.values():
        assert row[1] == str(trace) and row[2:4] == ["3", "3"]  # jobs, done
    # Progress on stderr, one line per run.
    assert captured.err.count("on " + str(trace)) == 2

    runs = json.loads(out.read_text())
    assert sorted(r["policy"] for r in runs) == ["fifo", "sia"]
    for run in runs:
        assert run["workload"] == str(trace)
        assert run["cluster"] == "hetero64x1"
        m = run["metrics"]
        assert m["jobs"] == m["finished"] == 3
        assert m["avg_jct_h"] > 0 and m["makespan_h"] >= m["p99_jct_h"] > 0
        assert sorted(j["name"] for j in run["jobs"]) == ["j0", "j1", "j2"]
        assert all(j["finish_time"] is not None for j in run["jobs"])
        assert run["rounds"], "per-round records are written"


def test_bad_workload_path(tmp_path, capsys):
    missing = tmp_path / "missing.csv"
    rc = main(["simulate", str(missing), "--policy", "fifo", "--jobs", "1"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("sia simulate: ") and str(missing) in err
    assert "Traceback" not in err


def test_bad_workload_path_says_not_a_file(tmp_path, capsys):
    missing = tmp_path / "missing.csv"
    assert main(["simulate", str(missing), "--policy", "fifo", "--jobs", "1"]) == 2
    err = capsys.readouterr().err
    assert "not a file" in err and "group:" not in err


def test_bad_rows_in_workload(tmp_path, capsys):
    path = tmp_path / "bad.csv"
    path.write_text("name,time,application,num_replicas,batch_size\nj0,0,resnet,1,256\n")
    rc = main(["simulate", str(path), "--policy", "fifo", "--jobs", "1"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "line 2" in err and "application" in err and "resnet" in err


def test_unknown_policy(trace, capsys):
    rc = main(["simulate", str(trace), "--policy", "nope", "--jobs", "1"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.strip() == ("sia simulate: policy: unknown 'nope'; "
                           "choose one of sia, pollux, gavel, fifo")


def test_bad_counts(trace, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["simulate", str(trace), "--jobs", "0"])
    assert exc.value.code == 2
    assert "--scale and --jobs must be >= 1" in capsys.readouterr().err
