"""Controller settings: defaults ← TOML ← SIA_* environment ← flags, with named errors."""

from __future__ import annotations

import pytest

from sia_grpc.controller.config import ConfigError, ControllerConfig, load_config


def test_layers_override_in_order(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[controller]\nround_duration = 30.0\npolicy = "gavel"\nlisten = "0.0.0.0:1"\n')
    cfg = load_config(path, env={"SIA_ROUND_DURATION": "20", "SIA_INLINE_SOLVER": "true"},
                      listen="127.0.0.1:2", policy=None)
    assert cfg.round_duration == 20.0  # env beats the file
    assert cfg.policy == "gavel"  # file beats the default; a flag left unset changes nothing
    assert cfg.listen == "127.0.0.1:2"  # the flag beats everything
    assert cfg.inline_solver is True


@pytest.mark.parametrize(("kwargs", "env", "message"), [
    ({}, {"SIA_ROUND_DURATION": "soon"}, "SIA_ROUND_DURATION: cannot read 'soon'"),
    ({"policy": "magic"}, {}, "policy: unknown 'magic'"),
    ({"round_duration": 0.0}, {}, "round_duration: must be positive"),
    ({"heartbeat_timeout": 1.0}, {}, "heartbeat_timeout: must exceed heartbeat_interval"),
    ({"listen": "nowhere"}, {}, "listen: expected HOST:PORT"),
    ({"metrics_listen": "9464"}, {}, "metrics_listen: expected HOST:PORT, got '9464'"),
    ({}, {"SIA_METRICS_LISTEN": "localhost:http"}, "metrics_listen: expected HOST:PORT"),
])
def test_bad_settings_name_the_setting(kwargs, env, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, env=env, **kwargs)


def test_unknown_key_in_file_is_an_error(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("round_durration = 5\n")
    with pytest.raises(ConfigError, match="unknown setting 'round_durration'"):
        load_config(path, env={})


def test_solve_timeout_never_exceeds_a_round():
    assert ControllerConfig(round_duration=10.0, solve_timeout=45.0).solve_timeout == 10.0


def test_metrics_listen_is_off_by_default_and_set_by_each_layer(tmp_path):
    from sia_grpc.controller.__main__ import parser

    assert ControllerConfig().metrics_listen == ""
    path = tmp_path / "c.toml"
    path.write_text('[controller]\nmetrics_listen = "10.0.0.5:9464"\n')
    assert load_config(path, env={}).metrics_listen == "10.0.0.5:9464"
    env = {"SIA_METRICS_LISTEN": "[::1]:0"}
    assert load_config(path, env=env).metrics_listen == "[::1]:0"
    args = parser().parse_args(["--metrics-listen", "127.0.0.1:9464"])
    assert load_config(path, env=env,
                       metrics_listen=args.metrics_listen).metrics_listen == "127.0.0.1:9464"


# -- policy settings: [policy.<name>] ← SIA_POLICY_<NAME>_<SETTING> ← --policy-set -------


def write(tmp_path, text: str):
    path = tmp_path / "c.toml"
    path.write_text(text)
    return path


def test_policy_tables_env_and_flags_override_in_order(tmp_path):
    path = write(tmp_path, '[controller]\nround_duration = 30.0\n\n[policy]\nname = "sia"\n\n'
                           '[policy.sia]\np = -1\nlambda = 2.0\nsolver_time_limit = 5\n\n'
                           '[policy.pollux]\np = -2\n')
    env = {"SIA_POLICY_SIA_P": "0.5", "SIA_POLICY_SIA_LAMBDA_": "3",
           "SIA_POLICY_SIA_HOLD_RESTORING": "false"}
    cfg = load_config(path, env=env, policy_set=["sia.p=1", "sia.lambda=4", "sia.p=2"])
    sia = cfg.policy_params["sia"]
    assert sia["p"] == 2.0  # the last flag beats the env, which beats the file
    assert sia["lambda_"] == 4.0  # an alias is the same setting in every layer
    assert sia["hold_restoring"] is False  # env only
    assert sia["solver_time_limit"] == 5.0  # file only, an int read as a float
    assert cfg.policy_params["pollux"] == {"p": -2.0}  # checked, kept, unused
    spec = cfg.policy_spec
    assert spec.name == "sia" and spec.round_duration == 30.0
    assert dict(spec.params) == sia
    built = spec.build()
    assert (built.config.p, built.config.lambda_, built.round_duration) == (2.0, 4.0, 30.0)


def test_policy_name_old_and_new_forms(tmp_path):
    assert load_config(write(tmp_path, 'policy = "gavel"\n'), env={}).policy == "gavel"
    assert load_config(write(tmp_path, '[controller]\npolicy = "pollux"\n'),
                       env={}).policy == "pollux"
    # A policy table at the top level (no [controller]) names and configures it.
    cfg = load_config(write(tmp_path, 'round_duration = 10.0\n[policy]\nname = "pollux"\n'
                                      '[policy.pollux]\np = -2\n'), env={})
    assert (cfg.policy, cfg.policy_params, cfg.round_duration) == \
        ("pollux", {"pollux": {"p": -2.0}}, 10.0)
    # [controller] names it; the top-level [policy.<name>] tables configure it.
    cfg = load_config(write(tmp_path, '[controller]\npolicy = "gavel"\n[policy.sia]\np = 1\n'),
                      env={})
    assert (cfg.policy, cfg.policy_params) == ("gavel", {"sia": {"p": 1.0}})
    assert cfg.policy_spec.params == ()  # gavel's settings: none
    # The environment and the flag name it too.
    assert load_config(None, env={"SIA_POLICY": "fifo"}).policy == "fifo"
    assert ControllerConfig().policy_spec.build().config.p == -0.5


@pytest.mark.parametrize(("text", "message"), [
    ('[policy.sia]\nlamda = 1\n', "policy.sia.lamda: unknown setting; did you mean lambda_?"),
    ('[policy.sia]\np = 0\n', "policy.sia.p: must be a non-zero finite number, got 0"),
    ('[policy.sia]\np = "x"\n', "policy.sia.p: must be a finite number, got 'x'"),
    ('[policy.sia]\nround_duration = 30\n', "policy.sia.round_duration: not a policy setting"),
    ('[policy.siaa]\np = 1\n', "policy.siaa: unknown policy; choose one of"),
    ('[policy]\np = -1\n', "policy.p: unknown key; a policy's settings go in its own table"),
    ('[controller]\npolicy = "sia"\n[policy]\nname = "gavel"\n',
     "policy: named twice ('sia', 'gavel')"),
    ('[controller]\n[controller.policy]\nname = "sia"\n[policy.sia]\np = 1\n',
     "policy: a table both in [controller] and at the top level"),
])
def test_bad_policy_table_names_the_key(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as exc:
        load_config(path, env={})
    assert str(exc.value).startswith(f"{path}: {message}"), str(exc.value)


@pytest.mark.parametrize(("env", "flags", "message"), [
    ({"SIA_POLICY_SIA_LAMDA": "1"}, [], "SIA_POLICY_SIA_LAMDA: unknown setting; did you mean "
                                        "lambda_?"),
    ({"SIA_POLICY_SIA_P": "soon"}, [], "SIA_POLICY_SIA_P: must be a finite number, got 'soon'"),
    ({"SIA_POLICY_SIAA_P": "1"}, [], "SIA_POLICY_SIAA_P: expected SIA_POLICY_<POLICY>_<SETTING> "
                                     "with POLICY one of SIA, POLLUX, GAVEL, FIFO, "
                                     "SIA_PARTITIONED"),
    ({"SIA_POLICY_SIA_ROUND_DURATION": "5"}, [],
     "SIA_POLICY_SIA_ROUND_DURATION: not a policy setting"),
    ({}, ["sia.p"], "--policy-set sia.p: expected POLICY.SETTING=VALUE"),
    ({}, ["p=1"], "--policy-set p: expected POLICY.SETTING, e.g. sia.p"),
    ({}, ["sia.p=0"], "--policy-set sia.p: must be a non-zero finite number, got 0"),
    ({}, ["gavel.p=1"], "--policy-set gavel.p: unknown setting; gavel has no settings"),
])
def test_bad_policy_env_or_flag_names_it(env, flags, message):
    with pytest.raises(ConfigError) as exc:
        load_config(None, env=env, policy_set=flags)
    assert str(exc.value).startswith(message), str(exc.value)


def test_config_built_in_code_is_checked_too():
    with pytest.raises(ConfigError, match=r"^policy\.sia\.lamda: unknown setting"):
        ControllerConfig(policy_params={"sia": {"lamda": 1}})
    cfg = ControllerConfig(policy_params={"sia": {"lambda": "2"}})
    assert cfg.policy_params == {"sia": {"lambda_": 2.0}}


def test_controller_start_up_error_is_one_line(tmp_path, capsys):
    from sia_grpc.controller.__main__ import main

    path = write(tmp_path, '[policy.sia]\nlamda = 1\n')
    assert main(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == f"sia-controller: {path}: policy.sia.lamda: unknown setting; " \
                  "did you mean lambda_?\n"
    assert main(["--policy-set", "sia.p=0"]) == 2
    assert capsys.readouterr().err == \
        "sia-controller: --policy-set sia.p: must be a non-zero finite number, got 0\n"


@pytest.mark.parametrize(("var", "value"), [("SIA_LOG_FORMAT", "bogus"),
                                            ("SIA_LOG_LEVEL", "loud")])
def test_a_bad_log_setting_in_the_environment_is_one_line(var, value, monkeypatch, capsys):
    from sia_grpc.controller.__main__ import main

    monkeypatch.setenv(var, value)
    assert main(["--listen", "127.0.0.1:0", "--db", ":memory:"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"sia-controller: {var}: unknown log") and err.count("\n") == 1


def test_a_postgres_store_and_its_password_file(tmp_path):
    secret = tmp_path / "pgpass"
    secret.write_text("hunter2\nignored\n")
    toml = tmp_path / "c.toml"
    toml.write_text('[controller]\nstore = "postgresql://sia@db:5432/sia"\n'
                    f'store_password_file = "{secret}"\n')
    config = load_config(toml, env={})
    assert config.store_target == "postgresql://sia@db:5432/sia"
    assert config.store_password() == "hunter2"
    assert load_config(None, env={}).store_target == "sia-controller.db"  # db_path's
    assert load_config(None, env={"SIA_STORE": "/x/sia.db"}).store_target == "/x/sia.db"
    assert load_config(None, env={}).store_password() is None
    with pytest.raises(ConfigError, match="^store_password_file: only for a postgresql://"):
        ControllerConfig(store_password_file=str(secret))
    gone = ControllerConfig(store="postgres://db/sia", store_password_file=str(tmp_path / "no"))
    with pytest.raises(ConfigError, match="^store_password_file: cannot read .*no: No such"):
        gone.store_password()


def test_an_unreachable_postgres_store_is_one_line(capsys):
    from sia_grpc.controller.__main__ import main
    from sia_grpc.testing.ports import free_port

    dsn = f"postgresql://sia:s3cret@127.0.0.1:{free_port()}/sia"
    assert main(["--listen", "127.0.0.1:0", "--store", dsn]) == 1
    err = capsys.readouterr().err
    assert "s3cret" not in err
    last = err.splitlines()[-1]  # (after the log lines)
    assert last.startswith("sia-controller: store: cannot open postgresql://sia:***@127.0.0.1")
    assert "Connection refused" in last
