"""`sia cancel` and `sia delete` on many jobs: by id, by label (--selector) or --all,
asking first for a selection unless -y, one line per job and exit 1 if any failed.
Against a live controller (LocalCluster) and, for the prompt, the in-memory one."""

from __future__ import annotations

import io

import pytest
from test_client_live import run_sia  # (`sia ARGV` in a thread, against a live controller)

from sia_grpc.api import pb
from sia_grpc.cli import main
from sia_grpc.client import AsyncSiaClient, is_terminal
from sia_grpc.controller.config import ControllerConfig
from sia_grpc.testing.localcluster import LocalCluster

CONFIG = ControllerConfig(listen="127.0.0.1:0", db_path=":memory:", round_duration=60.0,
                          early_round_delay=5.0, inline_solver=True)
SPEC = {"application": "cifar10", "adaptivity": "adaptive", "epochs": 500}


def sia_lines(out: list[str]) -> list[str]:
    """The command's own lines (the controller's log lines go to stdout too)."""
    return [ln for ln in out if ln.startswith(("a-", "b-", "c-"))]


@pytest.mark.timeout(120)
async def test_cancel_and_delete_many_by_id_label_and_all_on_a_live_controller():
    async with LocalCluster({"rtx": (1, 4)}, rate=60.0, config=CONFIG) as lc, \
            AsyncSiaClient(lc.target) as client:
        for job_id, team in (("a-1", "nlp"), ("a-2", "nlp"), ("b-1", "cv"), ("c-1", "cv")):
            await client.submit({"name": job_id, "labels": {"team": team}, **SPEC},
                                job_id=job_id)

        # Many ids: each reported, a missing one too, and the rest still done.
        rc, out, err = await run_sia("--controller", lc.target, "cancel", "a-1", "nope",
                                     "b-1")
        assert rc == 1
        assert sia_lines(out) == ["a-1 CANCELLED", "b-1 CANCELLED"]
        assert err == "error: nope: NOT_FOUND: job 'nope' not found\n"

        # A selection with no terminal to confirm on is refused, and nothing happens.
        rc, _, err = await run_sia("cancel", "--selector", "team=nlp", "--controller",
                                   lc.target)
        assert rc == 2 and "cancel 1 job(s): confirm with -y/--yes" in err
        assert not is_terminal(await client.get("a-2"))

        rc, out, err = await run_sia("cancel", "-l", "team=nlp", "-y", "--controller",
                                     lc.target)
        assert (rc, sia_lines(out), err) == (0, ["a-2 CANCELLED"], "")

        # Delete: only finished jobs are selected; an active one named is refused.
        rc, out, err = await run_sia("delete", "c-1", "a-1", "--controller", lc.target)
        assert rc == 1 and sia_lines(out) == ["a-1 deleted"]
        assert err.startswith("error: c-1: FAILED_PRECONDITION")
        rc, out, err = await run_sia("delete", "--all", "--yes", "--controller", lc.target)
        assert (rc, sorted(sia_lines(out))) == (0, ["a-2 deleted", "b-1 deleted"])
        assert [j.job_id async for j in client.list()] == ["c-1"]

        rc, out, err = await run_sia("cancel", "--all", "-y", "--controller", lc.target)
        assert (rc, sia_lines(out)) == (0, ["c-1 CANCELLED"])
        rc, out, err = await run_sia("cancel", "--all", "-y", "--controller", lc.target)
        assert (rc, sia_lines(out), err) == (0, [], "no jobs match\n")


class Terminal(io.StringIO):
    """Standard input on a terminal, where the user types `text`."""

    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("answer,code,left", [("y\n", 0, {"x-1"}), ("n\n", 1, set()),
                                              ("", 1, set())])
def test_a_selection_is_confirmed_on_a_terminal(target, fake, capsys, monkeypatch,
                                                 answer, code, left):
    for i in range(12):
        fake.add("j", job_id=f"t-{i:02}", labels={"team": "nlp"})
    fake.add("j", job_id="x-1", labels={"team": "cv"})
    monkeypatch.setattr("sys.stdin", Terminal(answer))
    assert main(["cancel", "--selector", "team=nlp", "--controller", target]) == code
    out, err = capsys.readouterr()
    assert ("cancel 12 job(s): t-00, t-01, t-02, t-03, t-04, t-05, t-06, t-07, t-08, t-09, "
            "and 2 more\ncontinue? [y/N] ") in err
    cancelled = {j for j, job in fake.jobs.items() if job.status.state == pb.JOB_STATE_CANCELLED}
    assert cancelled == ({f"t-{i:02}" for i in range(12)} if code == 0 else set())
    assert {j for j in fake.jobs if j not in cancelled} >= left
    assert len(out.splitlines()) == len(cancelled)


@pytest.mark.parametrize("argv,message", [
    (["cancel"], "give job ids, or --selector key=value, or --all"),
    (["cancel", "a", "--all"], "give job ids, or --selector key=value, or --all"),
    (["delete", "--all", "-l", "a=b"], "give job ids, or --selector key=value, or --all"),
])
def test_one_way_to_pick_the_jobs(target, fake, capsys, argv, message):
    assert main([*argv, "--controller", target]) == 2
    assert message in capsys.readouterr().err
    assert not fake.calls["CancelJob"] and not fake.calls["DeleteJob"]


def test_a_bad_selector_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["cancel", "--selector", "team"])
    assert exc.value.code == 2
    assert "expected key=value[,key=value]" in capsys.readouterr().err


def test_selector_matches_every_label(target, fake, capsys):
    fake.add("j", job_id="both", labels={"team": "nlp", "env": "dev"})
    fake.add("j", job_id="one", labels={"team": "nlp"})
    assert main(["cancel", "-l", "team=nlp,env=dev", "-y", "--controller", target]) == 0
    assert capsys.readouterr().out == "both CANCELLED\n"
