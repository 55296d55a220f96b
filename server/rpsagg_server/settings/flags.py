"""Where a server's configuration comes from: ``rpsagg-server``'s flags, environment variables
``RPSAGG_<FLAG>``, a ``.env`` file and a TOML ``--config`` file.

Precedence: command-line flag > environment variable (``--round-timeout`` ->
``RPSAGG_ROUND_TIMEOUT``) > ``.env`` in the working directory (the same names) > ``--config
FILE`` (TOML, keys spelled like the flags with ``-`` or ``_``) > default.

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


class _Parser(argparse.ArgumentParser):
    """Bad flags raise ``ValueError`` (one line on stderr, exit 2) instead of printing usage."""

    def error(self, message: str) -> NoReturn:
        raise ValueError(message)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="rpsagg-server",
        description="Rand-Proj-Spatial aggregation server (gRPC). Every flag can also be set "
        "with RPSAGG_<FLAG>, in a .env file or in a TOML --config file.",
    )
    add_version_flag(p, f"protocol {serde.PROTOCOL}")
    p.add_argument("--config", help="TOML file with any of the options below")
    groups = {"job": p.add_argument_group(
                  "the default job", "its settings; also the settings of POST /api/jobs"),
              "server": p.add_argument_group("the server", "shared by all its jobs")}
    for name, info in _FLAG_FIELDS.items():
        group = groups["job" if name in field_infos(JobSpec) else "server"]
        flag = "--" + name.replace("_", "-")
        shown = format_duration(info.default) if name in _DURATIONS else _shown(info.default)
        helptext = f"{info.description} (default: {shown})"
        if name in _SWITCHES:
            group.add_argument(flag, action="store_true", default=None, help=helptext)
        else:
            group.add_argument(flag, type=_flag_type(name, info), default=None,
                               help=helptext.replace("%", "%%"))
    return p


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


class _Environment(EnvSettingsSource):
    """``RPSAGG_<FLAG>`` variables of a given mapping (``os.environ`` by default)."""

    def __init__(self, settings_cls: type[BaseSettings], env: Mapping[str, str]) -> None:
        self._env = env
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        # the hook pydantic-settings' own dotenv source overrides to read another mapping;
        # the names are exactly RPSAGG_<FIELD IN CAPITALS> (the source matches lower case)
        return {k.lower(): v for k, v in self._env.items()
                if k.startswith("RPSAGG_") and k == k.upper()}


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
        values = super()._load_env_vars()
        return {k: v for k, v in values.items()
                if k.startswith("rpsagg_") and k[len("rpsagg_"):] in _FLAG_FIELDS}


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
                init_settings, _Checked(_Environment(settings_cls, environ))]
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
