"""Layered settings: flag > environment (`DLRFEED_*`) > TOML file (`--config`) > default.

The argparse parser of each sub-command is the settings model: its options, types, choices and
help are declared once, in the command module, and this module only decides where a value that
was not given as a flag comes from. Values from the environment and the file go through the
option's own `type` and `choices`, so a bad value fails the same way wherever it was written.
"""

from __future__ import annotations

import argparse
import os
import tomllib
from collections.abc import Callable, Mapping, Sequence
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from dlrfeed.domain.options import IntegrationOptions
from dlrfeed.errors import ConfigError

ENV_PREFIX = "DLRFEED_"
_N = TypeVar("_N", int, float)


class Pooler(StrEnum):
    """How dlrfeed connects: `--database-pooler`."""

    AUTO = "auto"
    """Ask the server: a PgBouncer answers on its admin database `pgbouncer`."""
    NONE = "none"
    """Straight to PostgreSQL (or a session pooler): named prepared statements are cached."""
    TRANSACTION = "transaction"
    """Through a transaction (or statement) pooler: no named prepared statements."""


def _number(text: str, kind: type[_N], acceptable: Callable[[_N], bool], requirement: str) -> _N:
    """`text` read as `kind` and checked, or an ArgumentTypeError that says what is needed."""
    try:
        value = kind(text)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if not acceptable(value):
        raise argparse.ArgumentTypeError(f"must {requirement}, got {value}")
    return value


def positive_int(text: str) -> int:
    """An option's type: a whole number of at least 1."""
    return _number(text, int, lambda value: value >= 1, "be at least 1")


def non_negative_int(text: str) -> int:
    """An option's type: a whole number of at least 0."""
    return _number(text, int, lambda value: value >= 0, "not be negative")


def positive_float(text: str) -> float:
    """An option's type: a number above 0 (seconds, mostly)."""
    return _number(text, float, lambda value: value > 0, "be above 0")


def non_negative_float(text: str) -> float:
    """An option's type: a number of at least 0 (0 turns a delay off)."""
    return _number(text, float, lambda value: value >= 0, "not be negative")


def host_port(text: str) -> tuple[str, int]:
    """`HOST:PORT` → (host, port); raises ValueError with a readable message."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def env_name(dest: str) -> str:
    """`database_url` → `DLRFEED_DATABASE_URL`."""
    return ENV_PREFIX + dest.upper().replace("-", "_")


def settable_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The options of `parser` that are settings (everything but --help, --config, --version)."""
    return [
        action
        for action in parser._actions  # argparse exposes no public list of a parser's options
        if action.option_strings
        and action.dest not in {"help", "config", "version"}
        and not isinstance(action, argparse._HelpAction)
    ]


def _load_toml(path: str) -> Mapping[str, Any]:
    try:
        with Path(path).open("rb") as handle:
            data = tomllib.load(handle)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
    # Accept both `database-url` and `database_url` spellings.
    return {str(key).replace("-", "_"): value for key, value in data.items()}


def _convert(action: argparse.Action, raw: Any, source: str) -> Any:
    option = action.option_strings[-1]
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text in {"1", "true", "yes", "on"}:
            return True
        if text in {"0", "false", "no", "off", ""}:
            return False
        raise ConfigError(f"{option} from {source}: expected true or false, got {raw!r}")
    if action.nargs in ("*", "+") or isinstance(action, argparse._AppendAction):
        items = raw if isinstance(raw, list) else [s for s in str(raw).split(",") if s]
        return [_convert_one(action, item, option, source) for item in items]
    return _convert_one(action, raw, option, source)


def _convert_one(action: argparse.Action, raw: Any, option: str, source: str) -> Any:
    value = raw
    if action.type is not None and callable(action.type):
        try:
            value = action.type(str(raw))
        except (TypeError, ValueError, argparse.ArgumentTypeError) as exc:
            raise ConfigError(f"{option} from {source}: {exc}") from exc
    if action.choices is not None and value not in action.choices:
        choices = ", ".join(map(str, action.choices))
        raise ConfigError(f"{option} from {source}: {raw!r} is not one of {choices}")
    return value


class LayeredDefaults:
    """Parses argv, then fills every option that was not given from env, then the TOML file."""

    def __init__(
        self,
        parser: argparse.ArgumentParser,
        subparsers: Mapping[str, argparse.ArgumentParser],
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self._parser = parser
        self._subparsers = subparsers
        self._environ = os.environ if environ is None else environ

    def parse(self, argv: Sequence[str]) -> argparse.Namespace:
        """The namespace with every setting resolved; records each value's source in `_sources`."""
        args = self._parser.parse_args(argv)
        sub = self._subparsers[args.command]
        given = self._given_dests(sub, argv)
        config_path = args.config or self._environ.get(ENV_PREFIX + "CONFIG")
        file_values = _load_toml(config_path) if config_path else {}
        sources: dict[str, str] = {}
        for action in settable_actions(sub):
            dest = action.dest
            if dest in given:
                sources[dest] = "flag"
                continue
            name = env_name(dest)
            if name in self._environ:
                setattr(args, dest, _convert(action, self._environ[name], f"env {name}"))
                sources[dest] = "env"
            elif dest in file_values:
                setattr(args, dest, _convert(action, file_values[dest], f"config {config_path}"))
                sources[dest] = "config"
            else:
                sources[dest] = "default"
        unknown = set(file_values) - {a.dest for a in settable_actions(sub)}
        if unknown:
            raise ConfigError(f"config file {config_path}: unknown setting(s) {sorted(unknown)}")
        args._sources = sources
        return args

    @staticmethod
    def _given_dests(sub: argparse.ArgumentParser, argv: Sequence[str]) -> set[str]:
        """The options that appear on the command line (`--opt value` or `--opt=value`)."""
        spelled = {token.split("=", 1)[0] for token in argv if token.startswith("-")}
        return {
            action.dest
            for action in settable_actions(sub)
            if any(option in spelled for option in action.option_strings)
        }


def add_database_url(parser: argparse.ArgumentParser, *, pooler: bool = True) -> None:
    """The `--database-url` option shared by every command that talks to PostgreSQL, and
    `--database-pooler` but for a command that works alike either way (`pooler=False`)."""
    parser.add_argument(
        "--database-url",
        metavar="URL",
        help="PostgreSQL URL, e.g. postgresql://dlrfeed@db.example/dlr (libpq style)",
    )
    if pooler:
        add_database_pooler(parser)


def add_database_pooler(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """`--database-pooler`: whether the database URL reaches PostgreSQL through a pooler."""
    parser.add_argument(
        "--database-pooler",
        choices=list(Pooler),
        default=Pooler.AUTO,
        type=Pooler,
        help="transaction: through PgBouncer-style transaction pooling (no named prepared "
        "statements); none: straight to PostgreSQL; auto: ask for a PgBouncer at the URL",
    )


def add_logging_options(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup, *, debug_help: str
) -> None:
    """`--log-level` and `--log-format`, shared by the long-running commands; `debug_help` says
    what `--log-level debug` adds for this command."""
    parser.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        default="info",
        help=debug_help,
    )
    parser.add_argument(
        "--log-format",
        choices=["auto", "json", "console"],
        default="auto",
        help="auto: a human renderer on a terminal, JSON lines otherwise",
    )


def required(args: argparse.Namespace, dest: str) -> str:
    """The value of a setting that has no default, or a one-line ConfigError naming its sources."""
    value = getattr(args, dest, None)
    if not value:
        option = "--" + dest.replace("_", "-")
        raise ConfigError(f"{option} is required (flag, {env_name(dest)} or --config file)")
    return str(value)


def add_integration_options(parser: argparse.ArgumentParser) -> None:
    """The integration-specific rules (P18, docs/rules.md), all off by default.

    `dlrfeed run` and `dlrfeed record-submissions` both take them, so that ingest and late
    correlation apply the same rules.
    """
    group = parser.add_argument_group("integration rules (P18; docs/rules.md)")
    group.add_argument(
        "--deadline-unknown-superseded",
        action="store_true",
        help="a network final may replace the gateway's deadline UNKNOWN (F3)",
    )
    group.add_argument(
        "--receipt-ids-hex",
        action="store_true",
        help="receipt ids are the hex form of the decimal ids returned at submit (P10)",
    )
    group.add_argument(
        "--bare-digits-are-international",
        action="store_true",
        help="destinations of bare digits already include the country code (P5)",
    )
    group.add_argument(
        "--receipt-timezone",
        default="UTC",
        metavar="ZONE",
        help="time zone of the reported submit/done dates (IANA name)",
    )


def integration_options(args: argparse.Namespace) -> IntegrationOptions:
    """The IntegrationOptions the command's flags ask for; a bad time zone is a ConfigError."""
    try:
        ZoneInfo(args.receipt_timezone)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ConfigError(
            f"--receipt-timezone: {args.receipt_timezone!r} is not an IANA time zone"
        ) from exc
    return IntegrationOptions(
        deadline_unknown_superseded=args.deadline_unknown_superseded,
        receipt_ids_hex=args.receipt_ids_hex,
        bare_digits_are_international=args.bare_digits_are_international,
        receipt_timezone=args.receipt_timezone,
    )
