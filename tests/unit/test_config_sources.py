"""``load_config``'s sources (pydantic-settings): flag > RPSAGG_<FLAG> > --config TOML > default."""

from __future__ import annotations

from pathlib import Path

import pytest

from rpsagg_server.settings.flags import load_config
from rpsagg_server.settings.serverconfig import ServerConfig

pytestmark = pytest.mark.unit


def test_each_source_overrides_the_next(tmp_path: Path) -> None:
    conf = tmp_path / "server.toml"
    conf.write_text("insecure = true\nn = 7\nk = 5\nround_timeout = 9.5\nmin-clients = 2\n")
    env = {"RPSAGG_K": "6", "RPSAGG_N": "9"}
    cfg = load_config(["--config", str(conf), "--n", "8"], env=env)
    default = ServerConfig(insecure=True)
    # n: flag over env over file; k: env over file; round timeout, min clients: file
    # (either key spelling); d: default
    assert (cfg.n, cfg.k, cfg.round_timeout, cfg.min_clients, cfg.d) == (
        8, 6, 9.5, 2, default.d)


def test_environment_names_are_exact() -> None:
    default = ServerConfig(insecure=True).n
    assert load_config(["--insecure"], env={"RPSAGG_N": "3"}).n == 3
    for name in ("rpsagg_n", "RPSAGG_n", "Rpsagg_N", "N"):
        assert load_config(["--insecure"], env={name: "3"}).n == default
    # other RPSAGG_ variables (RPSAGG_CONFIG included) are no options and are left alone
    assert load_config(["--insecure"], env={"RPSAGG_SOMETHING": "x"}).n == default


@pytest.mark.parametrize(("value", "on"), [
    ("1", True), ("true", True), ("YES", True), (" on ", True),
    ("0", False), ("no", False), ("", False), ("y", False), ("nope", False),
])
def test_switches_from_the_environment(value: str, on: bool) -> None:
    assert load_config(["--insecure"], env={"RPSAGG_EVAL": value}).eval is on


@pytest.mark.parametrize(("env", "toml", "message"), [
    ({"RPSAGG_K": "many"}, "", "--k (RPSAGG_K or config key k) must be an integer; got 'many'"),
    ({"RPSAGG_ROUND_TIMEOUT": "soon"}, "",
     "--round-timeout (RPSAGG_ROUND_TIMEOUT or config key round-timeout) must be a number; "
     "got 'soon'"),
    ({}, 'k = "x"\n', "--k (RPSAGG_K or config key k) must be an integer; got 'x'"),
    ({}, "decode-threads = 1.5\n",
     "--decode-threads (RPSAGG_DECODE_THREADS or config key decode-threads) must be an "
     "integer; got 1.5"),
])
def test_type_errors_name_the_option_and_its_sources(
    tmp_path: Path, env: dict[str, str], toml: str, message: str
) -> None:
    conf = tmp_path / "c.toml"
    conf.write_text("insecure = true\n" + toml)
    with pytest.raises(ValueError) as info:
        load_config([], env={**env, "RPSAGG_CONFIG": str(conf)})
    assert str(info.value) == message


def test_an_overridden_value_must_still_be_valid(tmp_path: Path) -> None:
    """A typo stays an error where a higher source happens to override it."""
    conf = tmp_path / "c.toml"
    conf.write_text('insecure = true\nk = "x"\n')
    with pytest.raises(ValueError, match="config key k\\) must be an integer; got 'x'"):
        load_config([], env={"RPSAGG_K": "5", "RPSAGG_CONFIG": str(conf)})
    with pytest.raises(ValueError) as info:
        load_config(["--insecure", "--k", "4"], env={"RPSAGG_K": "many"})
    assert str(info.value) == "--k (RPSAGG_K or config key k) must be an integer; got 'many'"


def test_config_file_errors(tmp_path: Path) -> None:
    conf = tmp_path / "c.toml"
    conf.write_text("insecure = true\nround-timout = 3\n")
    with pytest.raises(ValueError, match=f"{conf}: unknown option 'round-timout'$"):
        load_config(["--config", str(conf)], env={})
    with pytest.raises(FileNotFoundError):
        load_config(["--config", str(tmp_path / "missing.toml")], env={})
    conf.write_text("insecure = \n")
    with pytest.raises(ValueError, match="Invalid value"):  # tomllib's parse error
        load_config(["--config", str(conf)], env={})


def test_file_values_are_converted_like_the_flags(tmp_path: Path) -> None:
    conf = tmp_path / "c.toml"
    conf.write_text('insecure = true\nhost = 5\nround-timeout = "2.5"\nk = 3.0\neval = "yes"\n')
    cfg = load_config(["--config", str(conf)], env={})
    assert (cfg.host, cfg.round_timeout, cfg.k, cfg.eval) == ("5", 2.5, 3, True)


def test_value_bits_auto_from_every_source(tmp_path: Path) -> None:
    """``--value-bits auto`` (with --target-rel-error) from a flag, the environment or a
    config file is stored as "auto" (its number for the wire, 0); alone, or with a word other
    than auto, it is refused."""
    base = ["--insecure", "--target-rel-error", "0.5"]
    assert load_config([*base, "--value-bits", "auto"], {}).value_bits == "auto"
    assert load_config(base, {"RPSAGG_VALUE_BITS": "AUTO"}).value_bits == "auto"
    cfg_file = tmp_path / "c.toml"
    cfg_file.write_text('value-bits = "auto"\ntarget-rel-error = 0.5\n')
    cfg = load_config(["--insecure", "--config", str(cfg_file)], {})
    assert (cfg.value_bits, cfg.fixed_value_bits) == ("auto", 0)
    assert load_config([*base, "--value-bits", "8"], {}).value_bits == 8
    with pytest.raises(ValueError, match=r"--value-bits auto .* --target-rel-error"):
        load_config(["--insecure", "--value-bits", "auto"], {})
    with pytest.raises(ValueError, match="--value-bits"):
        load_config([*base, "--value-bits", "many"], {})


def test_dotenv_sits_between_the_environment_and_the_config_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``.env`` in the working directory: below flags and the environment, above the TOML
    file; its other names are left alone, and a bad value there names its variable."""
    monkeypatch.chdir(tmp_path)
    cfg_file = tmp_path / "c.toml"
    cfg_file.write_text("n = 4\nk = 9\nrounds = 7\n")
    (tmp_path / ".env").write_text("RPSAGG_N=5\nRPSAGG_K=11\nOTHER_TOOL_SETTING=x\n")
    cfg = load_config(["--insecure", "--config", str(cfg_file), "--k", "12"], {})
    assert (cfg.n, cfg.k, cfg.rounds) == (5, 12, 7)
    assert load_config(["--insecure"], {"RPSAGG_N": "6"}).n == 6
    (tmp_path / ".env").write_text("RPSAGG_N=many\n")
    with pytest.raises(ValueError, match=r"--n \(RPSAGG_N or config key n\) must be an integer"):
        load_config(["--insecure"], {})
