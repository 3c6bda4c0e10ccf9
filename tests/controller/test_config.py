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
