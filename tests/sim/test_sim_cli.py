"""`sia simulate` end to end on a tiny trace, and its error messages."""

from __future__ import annotations

import json

import pytest

from sia_grpc.cli import main


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
                           "choose one of sia, pollux, gavel, fifo, sia-partitioned, sia-plus")


def test_bad_counts(trace, capsys):
    assert main(["simulate", str(trace), "--jobs", "0"]) == 2
    assert "--scale and --jobs must be >= 1" in capsys.readouterr().err


# -- policy settings: --policy-config, --set, --round-duration ------------------------


def rows_of(out: str) -> dict[str, list[str]]:
    return {line.split()[0]: line.split() for line in out.splitlines()[2:]}


def test_set_sweeps_values_and_labels_each_run(trace, tmp_path, capsys):
    out = tmp_path / "runs.json"
    rc = main(["simulate", str(trace), "--policy", "sia,fifo", "--jobs", "1",
               "--set", "sia.p=-1,0.5", "--set", "sia.hold_restoring=false",
               "--json", str(out)])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    labels = ["sia(hold_restoring=false,p=-1)", "sia(hold_restoring=false,p=0.5)", "fifo"]
    assert set(rows_of(captured.out)) == set(labels)
    runs = {r["policy"]: r for r in json.loads(out.read_text())}
    assert set(runs) == set(labels)
    first = runs[labels[0]]
    assert first["params"] == {"hold_restoring": False, "p": -1.0}
    assert first["settings"]["p"] == -1.0 and first["settings"]["lambda_"] == 1.1
    assert first["settings"]["round_duration"] == 60.0
    assert runs[labels[1]]["settings"]["p"] == 0.5
    assert runs["fifo"]["params"] == {} and runs["fifo"]["settings"] == {"round_duration": 60.0}
    # `sia report` shows every variant as its own row.
    report = tmp_path / "report.md"
    assert main(["report", str(out), "--out", str(report)]) == 0
    text = report.read_text()
    assert all(f"| {label} |" in text for label in labels)


def test_policy_config_file_under_set_and_round_duration(trace, tmp_path, capsys):
    config = tmp_path / "policy.toml"
    config.write_text("[policy.sia]\np = -1\nlambda = 2.0\n\n[policy.pollux]\np = -2\n")
    out = tmp_path / "runs.json"
    rc = main(["simulate", str(trace), "--policy", "sia", "--jobs", "1",
               "--policy-config", str(config), "--set", "sia.p=1",
               "--round-duration", "120", "--json", str(out)])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    (run,) = json.loads(out.read_text())  # pollux's table: not run, ignored
    assert run["policy"] == "sia(lambda_=2,p=1)"  # --set beats the file
    assert run["settings"]["round_duration"] == 120.0
    assert [r["time"] for r in run["rounds"]][:3] == [0.0, 120.0, 240.0]


@pytest.mark.parametrize(("args", "message"), [
    (["--set", "sia.lamda=1"], "--set sia.lamda: unknown setting; did you mean lambda_?"),
    (["--set", "sia.p=-1,0"], "--set sia.p: must be a non-zero finite number, got 0"),
    (["--set", "pollux.p=1"], "--set pollux.p: pollux is not among --policy (sia)"),
    (["--set", "sia.p"], "--set sia.p: expected POLICY.SETTING=VALUE, e.g. sia.p=-1"),
    (["--set", "sia.round_duration=30"], "--set sia.round_duration: not a policy setting"),
    (["--round-duration", "0"], "--round-duration: must be positive, got 0"),
])
def test_bad_setting_is_one_line_naming_it(trace, capsys, args, message):
    rc = main(["simulate", str(trace), "--policy", "sia", "--jobs", "1", *args])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith(f"sia simulate: {message}"), err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(("text", "message"), [
    ("[policy.sia]\nlamda = 1\n", "policy.sia.lamda: unknown setting; did you mean lambda_?"),
    ("[controller]\npolicy = 'sia'\n", "controller: unknown table"),
    ("[policy]\nname = 'sia'\n", "policy.name: sia simulate runs the policies --policy names"),
    ("[policy.sia\n", ""),
])
def test_bad_policy_config_file(trace, tmp_path, capsys, text, message):
    config = tmp_path / "policy.toml"
    config.write_text(text)
    rc = main(["simulate", str(trace), "--policy", "sia", "--jobs", "1",
               "--policy-config", str(config)])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith(f"sia simulate: {config}: {message}"), err


def test_policy_settings_command(capsys):
    from sia_grpc.policy.params import settings_table

    assert main(["policy-settings"]) == 0
    assert capsys.readouterr().out == settings_table() + "\n"


def test_json_into_a_missing_directory_is_refused_before_simulating(trace, tmp_path, capsys):
    """Regression: a traceback (FileNotFoundError) after the whole simulation."""
    out = tmp_path / "no-such-dir" / "r.json"
    assert main(["simulate", str(trace), "--json", str(out)]) == 2
    assert capsys.readouterr().err == (f"sia simulate: --json {out}: no directory "
                                       f"'{out.parent}'\n")


# -- queues: --queues ----------------------------------------------------------------

def queued_trace(tmp_path, *rows: str):
    path = tmp_path / "q.csv"
    path.write_text("\n".join(["name,time,application,num_replicas,batch_size,queue", *rows]))
    return path


def test_queues_add_per_queue_metrics_table_and_report(tmp_path, queues_path, capsys):
    # A policy that ignores queues (FIFO) still gets per-queue JCT and GPU-hours; its
    # guarantee figures are undefined ("-"): it reports no guarantee rows.
    path = queued_trace(tmp_path, "j0,0,ncf,1,256,a", "j1,30,ncf,1,256,b", "j2,60,ncf,1,256,")
    out = tmp_path / "runs.json"
    rc = main(["simulate", str(path), "--policy", "fifo", "--jobs", "1", "--queues",
               str(queues_path), "--json", str(out), "--plots", str(tmp_path / "img")])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    table = captured.out.split("Per queue")[1]
    assert f"fifo {path} a " in table and f"fifo {path} b " in table
    assert "violation GPU h" in table and " default " not in table  # no jobs there
    (run,) = json.loads(out.read_text())
    q = run["metrics"]["queues"]
    assert set(q) == {"a", "b", "default"}
    assert q["a"]["jobs"] + q["b"]["jobs"] == 3 and q["default"]["jobs"] == 0
    assert q["a"]["guarantee_violation_gpu_h"] is None
    assert run["queues"]["a"] == {"guarantee": {"rtx": 4}, "guarantee_units": 0.0}
    assert (tmp_path / "img" / f"queues_fifo_{plots_name(path)}.png").is_file()
    report = tmp_path / "report.md"
    assert main(["report", str(out), "--out", str(report)]) == 0
    text = report.read_text()
    assert "### Queues" in text and "| fifo | a |" in text and "| fifo | b |" in text


def plots_name(path) -> str:
    from sia_grpc.sim.plots import safe_name

    return safe_name(str(path))


@pytest.mark.parametrize(("text", "message"), [
    ("[[queue]]\nname = 'a'\nguarantee = {rtx = 'x'}\n", "queue[0].guarantee.rtx: must be"),
    ("[assignment]\nshares = {zz = 1}\n", "assignment.shares.zz: no such queue"),
    ("[[queue]]\nnme = 'a'\n", "queue[0].nme: unknown key"),
])
def test_bad_queues_file_names_the_key(trace, tmp_path, capsys, text, message):
    queues = tmp_path / "q.toml"
    queues.write_text(text)
    rc = main(["simulate", str(trace), "--policy", "fifo", "--jobs", "1", "--queues",
               str(queues)])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith(f"sia simulate: {queues}: {message}"), err
    assert "Traceback" not in err


def test_a_trace_naming_an_unknown_queue_is_refused_naming_the_line(tmp_path, queues_path,
                                                                   capsys):
    path = queued_trace(tmp_path, "j0,0,ncf,1,256,a", "j1,0,ncf,1,256,c")
    rc = main(["simulate", str(path), "--policy", "fifo", "--jobs", "1", "--queues",
               str(queues_path)])
    err = capsys.readouterr().err
    assert rc == 2 and f"{path} line 3: queue: unknown queue 'c'" in err, err


def test_a_missing_queues_file(trace, tmp_path, capsys):
    rc = main(["simulate", str(trace), "--queues", str(tmp_path / "none.toml")])
    assert rc == 2 and "none.toml" in capsys.readouterr().err
