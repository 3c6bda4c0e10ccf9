"""The global flags (the connection flags and -o) before the subcommand as well as
after it (`sia --controller A,B ls`, as docs/operations.md shows), and
`sia-controller --help`'s policies, from the policy registry."""

from __future__ import annotations

import json

import pytest

from sia_grpc.cli import build_parser, main
from sia_grpc.controller import __main__ as controller_main
from sia_grpc.policy import POLICIES

UNUSED = "127.0.0.1:1"  # nothing listens there


def test_the_connection_flags_and_output_before_the_subcommand(target, fake, capsys):
    fake.add("resnet", job_id="r1")
    assert main(["--controller", target, "-o", "json", "ls"]) == 0
    assert [j["job_id"] for j in json.loads(capsys.readouterr().out)["jobs"]] == ["r1"]


def test_the_same_flags_after_the_subcommand(target, fake, capsys):
    fake.add("resnet", job_id="r1")
    assert main(["ls", "--controller", target, "-o", "json"]) == 0
    assert [j["job_id"] for j in json.loads(capsys.readouterr().out)["jobs"]] == ["r1"]


def test_given_in_both_places_the_one_after_the_subcommand_wins(target, fake, capsys):
    fake.add("resnet", job_id="r1")
    assert main(["--controller", UNUSED, "-o", "yaml", "get", "r1", "--controller", target,
                 "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["job_id"] == "r1"
    assert main(["--controller", target, "get", "r1", "--controller", UNUSED]) == 1
    assert "cannot reach the controller at 127.0.0.1:1" in capsys.readouterr().err


@pytest.mark.parametrize("argv,expected", [
    (["--controller", "a:1,b:2", "ls"], {"controller": "a:1,b:2"}),
    (["ls", "--controller", "a:1,b:2"], {"controller": "a:1,b:2"}),
    (["--token-file", "t", "--ca", "ca.pem", "--cert", "c.pem", "--key", "k.pem", "cancel",
      "j"], {"token_file": "t", "ca": "ca.pem", "cert": "c.pem", "key": "k.pem"}),
    (["--ca", "a.pem", "cancel", "j", "--ca", "b.pem"], {"ca": "b.pem", "cert": None}),
    (["-o", "wide", "cluster"], {"output": "wide"}),
    (["--output", "json", "queues", "-o", "yaml"], {"output": "yaml"}),
    (["--controller", "a:1", "dashboard"], {"controller": "a:1"}),
    (["ls"], {"controller": build_parser().parse_args(["ls"]).controller, "output": None,
              "token_file": None}),
])
def test_the_parsed_flags(argv, expected):
    args = vars(build_parser().parse_args(argv))
    assert {k: args[k] for k in expected} == expected


def test_defaults_stay_put_after_a_parse_with_flags_before():
    parser = build_parser()
    parser.parse_args(["--controller", "a:1", "-o", "json", "ls"])
    args = parser.parse_args(["ls"])
    assert args.controller != "a:1" and args.output is None


@pytest.mark.parametrize("argv,message", [
    (["-o", "wide", "queues"], "invalid choice for 'sia queues': 'wide'"),
    (["-o", "json", "cancel", "j"], "--output: 'sia cancel' does not take it"),
    (["--controller", "a:1", "simulate"], "--controller: 'sia simulate' does not take it"),
    (["-o", "xml", "ls"], "invalid choice: 'xml'"),
])
def test_a_global_flag_the_command_cannot_use_is_refused(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_sia_help_lists_the_global_flags(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "global flags" in out and "--controller" in out and "-o {json,yaml,wide}" in out


def test_sia_controller_help_lists_every_registered_policy(capsys):
    with pytest.raises(SystemExit) as exc:
        controller_main.main(["--help"])
    assert exc.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # (unwrapped)
    assert "sia-plus" in POLICIES and "sia-partitioned" in POLICIES
    assert f"--policy POLICY {controller_main.policy_names()} (default sia)" in text
    for name in POLICIES:
        assert name in controller_main.policy_names().replace(" or ", ", ").split(", ")


def test_sia_simulate_help_names_every_registered_policy(capsys):
    # (its text is written out: `sia` starts without importing the policies)
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert all(name in text for name in POLICIES)
