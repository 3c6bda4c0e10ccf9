"""Policy settings by name (`sia_grpc.policy.params`): the one parser behind the
controller's [policy] tables, `sia simulate --set` and `OptimizeRequest.params`."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sia_grpc.policy import POLICIES, SettingError, SiaConfig, make_policy
from sia_grpc.policy import params as P


def error(name: str, params: dict, **kw) -> SettingError:
    with pytest.raises(SettingError) as exc:
        make_policy(name, params, **kw)
    return exc.value


def test_defaults_without_params():
    assert make_policy("sia").config == SiaConfig()
    assert make_policy("pollux").config.p == -1.0
    assert make_policy("gavel").round_duration == 360.0


def test_values_are_converted_from_strings_and_toml_types():
    policy = make_policy("sia", {"p": "-1", "lambda_": 2, "hold_restoring": "false",
                                 "solver_time_limit": "5.5", "solver": "glpk_mi"})
    c = policy.config
    assert (c.p, c.lambda_, c.hold_restoring, c.solver_time_limit, c.solver) == \
        (-1.0, 2.0, False, 5.5, "glpk_mi")
    assert isinstance(c.lambda_, float)
    assert make_policy("sia", {"hold_restoring": True}).config.hold_restoring is True
    # The rest keeps the policy's own defaults (Pollux's are not Sia's).
    assert make_policy("pollux", {"p": 1}).config.lambda_ == 1000.0


def test_lambda_is_an_alias_of_lambda_():
    assert make_policy("sia", {"lambda": "2"}).config.lambda_ == 2.0
    err = error("sia", {"lambda": 2, "lambda_": 3})
    assert str(err) == "sia.lambda_: given twice (also as lambda)"


@pytest.mark.parametrize(("params", "message"), [
    ({"p": 0}, "sia.p: must be a non-zero finite number, got 0"),
    ({"p": "0"}, "sia.p: must be a non-zero finite number, got 0"),
    ({"p": "abc"}, "sia.p: must be a finite number, got 'abc'"),
    ({"p": "nan"}, "sia.p: must be a finite number, got 'nan'"),
    ({"p": True}, "sia.p: must be a finite number, got True"),
    ({"lambda": -1}, "sia.lambda: must be positive, got -1"),
    ({"max_scale_up": 0.5}, "sia.max_scale_up: must be at least 1, got 0.5"),
    ({"rel_gap": 1}, "sia.rel_gap: must be in [0, 1), got 1"),
    ({"hold_restoring": "maybe"}, "sia.hold_restoring: must be true or false, got 'maybe'"),
    ({"hold_restoring": 1}, "sia.hold_restoring: must be true or false, got 1"),
    ({"solver": "cplex"}, "sia.solver: unknown 'cplex'; choose one of highs, glpk_mi, "
                          "cvxpy-highs"),
    ({"solver": 3}, "sia.solver: must be a string, got 3"),
    ({"lamda": 1}, "sia.lamda: unknown setting; did you mean lambda_?"),
    ({"solver_time": 1}, "sia.solver_time: unknown setting; did you mean solver_time_limit?"),
    ({"zzz": 1}, "sia.zzz: unknown setting; sia's settings are p, lambda_, goodput_clip, "
                 "max_scale_up, solver_time_limit, rel_gap, solver, hold_restoring, "
                 "restart_horizon, grow_into_idle"),
])
def test_bad_setting_names_the_key(params, message):
    err = error("sia", params)
    assert str(err) == message
    (key,) = params
    assert (err.policy, err.setting) == ("sia", key)


def test_policies_without_settings():
    assert str(error("gavel", {"p": 1})) == "gavel.p: unknown setting; gavel has no settings"
    assert P.settings("fifo") == []


def test_round_duration_is_not_a_setting_but_the_callers():
    err = error("sia", {"round_duration": 30})
    assert err.key == "sia.round_duration"
    assert "not a policy setting" in err.problem
    for where in ("round_duration", "SIA_ROUND_DURATION", "--round-duration",
                  "round_duration_s"):
        assert where in err.problem
    assert make_policy("gavel", round_duration=60).round_duration == 60.0
    assert make_policy("sia", {"p": 1}, round_duration=30).config.round_duration == 30.0
    bad = error("fifo", {}, round_duration=0)
    assert str(bad) == "round_duration: must be positive, got 0"


def test_unknown_policy():
    err = error("nope", {})
    assert str(err) == ("policy: unknown 'nope'; choose one of sia, pollux, gavel, fifo, "
                        "sia-partitioned, sia-plus")


def test_settings_list_each_policys_defaults_and_help():
    sia = {s.name: s for s in P.settings("sia")}
    assert set(sia) == {"p", "lambda_", "goodput_clip", "max_scale_up", "solver_time_limit",
                        "rel_gap", "solver", "hold_restoring", "restart_horizon",
                        "grow_into_idle"}
    assert (sia["p"].kind, sia["p"].default) == ("float", -0.5)
    assert all(s.help for s in sia.values())
    pollux = {s.name: s.default for s in P.settings("pollux")}
    assert (pollux["p"], pollux["lambda_"], pollux["hold_restoring"]) == (-1.0, 1000.0, False)
    assert "round_duration" not in sia


def test_docs_hold_the_settings_table():
    """docs/operations.md lists exactly what `sia policy-settings` prints."""
    doc = (Path(__file__).parents[2] / "docs" / "operations.md").read_text()
    assert P.settings_table() in doc


def test_current_and_label():
    policy = make_policy("sia", {"p": "-1"}, round_duration=90)
    current = P.current(policy)
    assert current["p"] == -1.0 and current["round_duration"] == 90.0
    assert set(current) == {s.name for s in P.settings("sia")} | {"round_duration"}
    assert P.label("sia", {}) == "sia"
    assert P.label("sia", {"p": -1.0, "hold_restoring": False}) == \
        "sia(p=-1,hold_restoring=false)"


def test_assignments():
    assert P.assignment(" sia.p = -1 ") == ("sia", "p", "-1")
    assert P.assignment("pollux.lambda=2") == ("pollux", "lambda", "2")
    for text, message in [("sia.p", "sia.p: expected POLICY.SETTING=VALUE, e.g. sia.p=-1"),
                          ("=1", "=1: expected POLICY.SETTING=VALUE"),
                          ("p=1", "p: expected POLICY.SETTING, e.g. sia.p"),
                          ("siaa.p=1", "siaa.p: unknown policy 'siaa'; choose one of sia, ")]:
        with pytest.raises(SettingError) as exc:
            P.assignment(text)
        assert str(exc.value).startswith(message)


def test_toml_tables():
    assert P.from_toml({"sia": {"p": -1, "lambda": 2}, "pollux": {}}) == \
        {"sia": {"p": -1.0, "lambda_": 2.0}, "pollux": {}}
    for table, message in [
        ({"sia": {"lamda": 1}}, "policy.sia.lamda: unknown setting; did you mean lambda_?"),
        ({"siaa": {"p": 1}}, "policy.siaa: unknown policy; choose one of"),
        ({"p": -1}, "policy.p: unknown key; a policy's settings go in its own table, "
                    "e.g. [policy.sia] p = -1"),
        ({"sia": 3}, "policy.sia: must be a table of settings"),
    ]:
        with pytest.raises(SettingError) as exc:
            P.from_toml(table)
        assert str(exc.value).startswith(message)


def test_spec_builds_the_policy():
    spec = P.PolicySpec("sia", (("p", 1.0),), 30.0)
    policy = spec.build()
    assert (policy.config.p, policy.round_duration) == (1.0, 30.0)
    assert hash(spec) == hash(P.PolicySpec("sia", (("p", 1.0),), 30.0))


# -- properties ----------------------------------------------------------------------

finite = st.floats(allow_nan=False, allow_infinity=False, width=64).filter(lambda x: x != 0)


@given(p=finite)
def test_any_non_zero_p_round_trips_through_text(p):
    """What the environment, a flag or the wire carries (repr of a float) reads back
    exactly."""
    assert make_policy("sia", {"p": repr(p)}).config.p == p


@given(name=st.sampled_from(sorted(POLICIES)),
       key=st.text(st.characters(codec="ascii"), min_size=1, max_size=20))
def test_any_other_key_is_an_error_naming_it(name, key):
    known = {s.name for s in P.settings(name)} | set(P.ALIASES)
    if key in known:
        return
    with pytest.raises(SettingError) as exc:
        make_policy(name, {key: "1"})
    assert exc.value.setting == key and exc.value.policy == name


@given(value=st.one_of(st.text(max_size=10), st.floats(), st.integers(), st.booleans()))
def test_any_value_of_p_is_accepted_or_named(value):
    try:
        p = make_policy("sia", {"p": value}).config.p
    except SettingError as err:
        assert err.key == "sia.p"
    else:
        assert math.isfinite(p) and p != 0
