"""Where a server's configuration comes from: ``rpsagg-server``'s flags, environment variables
``RPSAGG_<FLAG>``, a ``.env`` file and a TOML ``--config`` file.

Precedence: command-line flag > environment variable (``--round-timeout`` ->
``RPSAGG_ROUND_TIMEOUT``) > ``.env`` in the working directory (the same names) > ``--config
FILE`` (TOML, keys spelled like the flags with ``-`` or ``_``) > default. The server's own
certificate and key are named by their role, ``RPSAGG_SERVER_TLS_CERT`` and
``RPSAGG_SERVER_TLS_KEY`` (:data:`ROLE_NAMES`; a client's are ``RPSAGG_CLIENT_TLS_CERT``...); their
older names ``RPSAGG_TLS_CERT`` and ``RPSAGG_TLS_KEY`` are still read, with a line saying so.

Every flag is a field of :class:`~rpsagg_server.settings.jobspec.JobSpec` (the job flags) or
:class:`~rpsagg_server.settings.process.ServerSettings` (the server's): its name, type, default and
help come from there. The environment, ``.env`` and the file are pydantic-settings sources
merged in that order with the flags (parsed by argparse, for their help and messages) on top;
pydantic converts every value to its field's type, and :class:`ServerConfig` then checks the
fields and their combination.
"""

from __future__ import annotations

import argparse
import os
import typing
from collections.abc import Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any, NoReturn

from pydantic import ValidationError, create_model, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    DotEnvSettingsSource,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from rpsagg import add_version_flag
from rpsagg.commandline import EnvironmentVariable, ExitStatus, HelpFormatter, exit_statuses
from rpsagg_server.settings.jobspec import JobSpec, parse_block_size, parse_value_bits
from rpsagg_server.settings.process import ServerSettings, format_duration, parse_duration
from rpsagg_server.settings.rules import field_infos
from rpsagg_server.settings.serverconfig import ServerConfig, first_error
from rpsagg_wire.v1 import serde

#: the fields that are flags: every job setting and server setting
_FLAG_FIELDS: dict[str, FieldInfo] = {**field_infos(JobSpec),
                                      **field_infos(ServerSettings)}
_SWITCHES = {name for name, info in _FLAG_FIELDS.items() if info.annotation is bool}
_PARSERS = {"value_bits": parse_value_bits, "block_size": parse_block_size,
            "keep_finished_for": parse_duration}
_DURATIONS = {name for name, parse in _PARSERS.items() if parse is parse_duration}
PROG = "rpsagg-server"
#: the variables named by their role instead of RPSAGG_<FLAG>, and their older names
ROLE_NAMES: dict[str, EnvironmentVariable] = {
    "tls_cert": EnvironmentVariable("RPSAGG_SERVER_TLS_CERT", deprecated=("RPSAGG_TLS_CERT",)),
    "tls_key": EnvironmentVariable("RPSAGG_SERVER_TLS_KEY", deprecated=("RPSAGG_TLS_KEY",)),
}
_OLD_NAMES = {old for var in ROLE_NAMES.values() for old in var.deprecated}


def env_name(field: str) -> str:
    """The environment variable of a server setting: ``RPSAGG_<FIELD>``, or its role's name."""
    var = ROLE_NAMES.get(field)
    return var.name if var is not None else f"RPSAGG_{field.upper()}"


#: the flags' groups in --help: each starts at its first field (in the models' order) and
#: shows an example; a job group's title starts with :data:`JOB_GROUP`
JOB_GROUP = "the default job"
_GROUP_STARTS: dict[str, tuple[str, str]] = {
    "estimator": (f"{JOB_GROUP}: the scheme",
                  "e.g. --estimator rand-proj-spatial --transform avg --n 10 --k 102 --d 1024"),
    "task": (f"{JOB_GROUP}: the task and its data",
             "e.g. --task mean --data external --d 0 (each client's own vectors)"),
    "rounds": (f"{JOB_GROUP}: the rounds", "e.g. --rounds 0 --round-timeout 30 --min-clients 8"),
    "value_bits": (f"{JOB_GROUP}: the values on the wire",
                   "e.g. --value-bits 4 --block-size auto"),
    "eval": (f"{JOB_GROUP}: evaluation and the tasks' parameters", "e.g. --eval --seed 7"),
    "target_rel_error": (f"{JOB_GROUP}: target mode",
                         "e.g. --target-rel-error 0.05 --k-max 4096"),
    "grpc_port": ("gRPC", "e.g. --grpc-port 50051 --host 0.0.0.0 --grpc-idle-timeout 30"),
    "tls_cert": ("security",
                 "e.g. --tls-cert server.pem --tls-key server.key --tokens tokens.txt "
                 "--admin-tokens admin-tokens.txt (or --insecure on a trusted network)"),
    "http_port": ("the dashboard and its API",
                  "e.g. --http-port 8000 --http-host 0.0.0.0 --http-tokens http-tokens.txt "
                  "--http-tls"),
    "db": ("storage and the job's life", "e.g. --db /data/rpsagg.db --linger -1"),
    "no_default_job": ("jobs", "e.g. --no-default-job --max-jobs 4 --keep-finished-for 30d"),
    "decode_device": ("decoding and the event loop",
                      "e.g. --decode-threads 8, or --decode-backend ray --ray-address "
                      "10.0.0.5:6379"),
}
DESCRIPTION = f"""\
The Rand-Proj-Spatial aggregation server: gRPC for the clients, the dashboard, its JSON API
and /metrics on the HTTP port. Every flag can also be set with an environment variable,
RPSAGG_<FLAG> (the certificate and key: {ROLE_NAMES["tls_cert"].name} and
{ROLE_NAMES["tls_key"].name}), in a .env file or in a TOML --config file; a flag overrides the
variable, which overrides .env, which overrides the file.

  rpsagg-server --insecure --n 10 --k 102 --d 1024 --rounds 10 --eval
  rpsagg-server --tls-cert server.pem --tls-key server.key --tokens tokens.txt \\
      --task mean --data external --n 3 --d 1000 --k 400
  rpsagg-server --insecure --no-default-job --http-host 0.0.0.0 --admin-tokens admin.txt
"""


class _Parser(argparse.ArgumentParser):
    """Bad flags raise ``ValueError`` (one line on stderr, exit 2) instead of printing usage."""

    def error(self, message: str) -> NoReturn:
        raise ValueError(message)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, usage=f"{PROG} [options]", description=DESCRIPTION,
                formatter_class=HelpFormatter,
                epilog=exit_statuses(ExitStatus.INTERRUPTED, notes={
                    ExitStatus.DONE: "the job done, or a signal (SIGTERM, Ctrl-C) served "
                    "after the drain",
                    ExitStatus.USAGE: "also a start-up check: a port taken, a database of "
                    "another job, a descriptor limit its jobs do not fit"}))
    add_version_flag(p, f"protocol {serde.PROTOCOL}")
    config = p.add_argument("--config", metavar="FILE", help="TOML file with any of the "
                            "options below (keys spelled like the flags)")
    config.environment = EnvironmentVariable("RPSAGG_CONFIG")  # type: ignore[attr-defined]
    group: argparse._ArgumentGroup | None = None
    for name, info in _FLAG_FIELDS.items():
        if name in _GROUP_STARTS:
            group = p.add_argument_group(*_GROUP_STARTS[name])
        if group is None:
            raise ValueError(f"{name}: before the first group of --help")
        flag = "--" + name.replace("_", "-")
        shown = format_duration(info.default) if name in _DURATIONS else _shown(info.default)
        helptext = f"{info.description} (default: {shown})"
        if name in _SWITCHES:
            action = group.add_argument(flag, action="store_true", default=None,
                                        help=helptext)
        else:
            action = group.add_argument(flag, type=_flag_type(name, info), default=None,
                                        metavar=_metavar(name, info),
                                        help=helptext.replace("%", "%%"))
        # shown in --help; the value is the sources' to read (load_config)
        action.environment = (  # type: ignore[attr-defined]
            ROLE_NAMES.get(name) or EnvironmentVariable(env_name(name)))
    return p


def _metavar(name: str, info: FieldInfo) -> str:
    """A flag's placeholder: what its value is."""
    if name in _DURATIONS:
        return "DURATION"
    if name.endswith(("_bytes", "_connections", "_jobs")) or name in ("n", "k", "d"):
        return "N"
    kind = _flag_type(name, info)
    if name.endswith(("timeout", "drain", "linger")):
        return "S"
    return "N" if kind is int else "NUMBER" if kind is float else "VALUE"


def _shown(default: Any) -> str:
    """A default as ``--help`` shows it."""
    if default is None:
        return "none"
    if isinstance(default, bool):
        return "off" if not default else "on"
    return str(default)


def _flag_type(name: str, info: FieldInfo) -> Any:
    """argparse's type: the field's parser (its message kept), or int or float for a field
    of that type (``int | None`` included), else str."""
    parse = _PARSERS.get(name)
    if parse is not None:
        def parsed(text: str) -> Any:
            try:
                return parse(text)
            except ValueError as exc:
                raise argparse.ArgumentTypeError(str(exc)) from None
        return parsed
    kinds = set(typing.get_args(info.annotation) or (info.annotation,)) - {type(None)}
    return next((t for t in (int, float) if t in kinds), str)


class _SettingsBase(BaseSettings):
    """The options every source can set, converted by pydantic to their field types."""

    model_config = SettingsConfigDict(env_prefix="RPSAGG_", extra="forbid",
                                      coerce_numbers_to_str=True)

    @field_validator(*_PARSERS, mode="before", check_fields=False)
    @classmethod
    def _auto(cls, value: Any, info: Any) -> Any:
        """``auto`` (any case), a duration or a number, from the environment or a config
        file."""
        return _PARSERS[info.field_name](value)

    @field_validator(*sorted(_SWITCHES), mode="before", check_fields=False)
    @classmethod
    def _switch(cls, value: Any) -> bool:
        """A switch from the environment is on for 1, true, yes or on (any case)."""
        if isinstance(value, str):
            return value.strip().lower() in ("1", "true", "yes", "on")
        return bool(value)


def _settings_model() -> type[_SettingsBase]:
    """The sources' model: every flag's field, its type and default (no rules: those are
    ServerConfig's, after the sources are merged)."""
    hints = typing.get_type_hints(ServerConfig)
    spec: dict[str, Any] = {f.name: (hints[f.name], _FLAG_FIELDS[f.name].default)
                            for f in fields(ServerConfig) if f.name in _FLAG_FIELDS}
    model: type[_SettingsBase] = create_model("ServerSources", __base__=_SettingsBase, **spec)
    return model


_Settings = _settings_model()


def _by_field(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``env`` keyed ``rpsagg_<field>``, as pydantic-settings matches them:
    ``RPSAGG_<FIELD IN CAPITALS>``, a role's name (:data:`ROLE_NAMES`) for its field, or its
    older name with a line on standard error."""
    out = {k.lower(): v for k, v in env.items()
           if k.startswith("RPSAGG_") and k == k.upper() and k not in _OLD_NAMES}
    for field, var in ROLE_NAMES.items():
        out.pop(var.name.lower(), None)
        value = var.read(env, PROG)
        if value is not None:
            out[f"rpsagg_{field}"] = value
    return out


class _Environment(EnvSettingsSource):
    """``RPSAGG_<FLAG>`` variables of a given mapping (``os.environ`` by default)."""

    def __init__(self, settings_cls: type[BaseSettings], env: Mapping[str, str]) -> None:
        self._env = env
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        # the hook pydantic-settings' own dotenv source overrides to read another mapping
        return dict(self._env)


class _ConfigFile(TomlConfigSettingsSource):
    """The ``--config`` TOML file; keys are spelled like the flags, with ``-`` or ``_``."""

    def _read_file(self, file_path: Any) -> dict[str, Any]:
        raw = super()._read_file(file_path)
        out = {}
        for key, value in raw.items():
            name = key.replace("-", "_")
            if name not in _Settings.model_fields:
                raise ValueError(f"{file_path}: unknown option {key!r}")
            out[name] = value
        return out


class _DotEnv(DotEnvSettingsSource):
    """``.env`` in the working directory: ``RPSAGG_<FLAG>=value`` lines, as the environment
    (other names in it are left alone)."""

    def __init__(self, settings_cls: type[BaseSettings], path: Path) -> None:
        self._path = path
        super().__init__(settings_cls, env_file=path)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        values = super()._load_env_vars()  # keys in lower case
        named = _by_field({k.upper(): v for k, v in values.items() if v is not None})
        return {k: v for k, v in named.items() if k[len("rpsagg_"):] in _FLAG_FIELDS}


class _Checked(PydanticBaseSettingsSource):
    """Every value of ``source`` must convert to its field's type, whether a source above
    overrides it or not (``RPSAGG_K=many`` is an error even with ``--k 4``)."""

    def __init__(self, source: PydanticBaseSettingsSource) -> None:
        super().__init__(source.settings_cls)
        self.source = source

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self.source.get_field_value(field, field_name)

    def __call__(self) -> dict[str, Any]:
        values = self.source()
        try:
            _Settings.model_validate(values)  # validation only: no sources are read
        except ValidationError as exc:
            raise _type_error(exc) from None
        return values


def _type_error(exc: ValidationError) -> ValueError:
    """The first conversion error, as the one line the command prints."""
    err = exc.errors()[0]
    name = str(err["loc"][0]) if err["loc"] else ""
    flag = name.replace("_", "-")
    kinds = set(typing.get_args(_Settings.model_fields[name].annotation)
                or (_Settings.model_fields[name].annotation,)) if name else set()
    kind = "an integer" if int in kinds else "a number" if float in kinds else "a string"
    return ValueError(f"--{flag} (RPSAGG_{name.upper()} or config key {flag}) must be "
                      f"{kind}; got {err['input']!r}")


def load_config(
    argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None
) -> ServerConfig:
    """Parse flags, environment and config file into a validated :class:`ServerConfig`."""
    environ: Mapping[str, str] = os.environ if env is None else env
    args = _parser().parse_args(argv)
    flags = {name: getattr(args, name) for name in _Settings.model_fields
             if getattr(args, name) is not None}
    config_path = args.config or environ.get("RPSAGG_CONFIG")
    dotenv = Path(".env")
    variables = _by_field(environ)
    if config_path:
        Path(config_path).open("rb").close()  # an unreadable file is an error, not empty

    class Settings(_Settings):  # type: ignore[misc, valid-type]
        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            sources: list[PydanticBaseSettingsSource] = [
                init_settings, _Checked(_Environment(settings_cls, variables))]
            if dotenv.is_file():
                sources.append(_Checked(_DotEnv(settings_cls, dotenv)))
            if config_path:
                sources.append(_Checked(_ConfigFile(settings_cls, toml_file=Path(config_path))))
            return tuple(sources)

    try:
        settings = Settings(**flags)
    except ValidationError as exc:
        raise _type_error(exc) from None
    try:
        return ServerConfig(**settings.model_dump())
    except ValidationError as exc:
        raise first_error(exc) from None
