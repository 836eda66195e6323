"""interfaces §3: flag > env (DLRFEED_*) > TOML file (--config) > default, with one-line errors."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from dlrfeed.config import (
    LayeredDefaults,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
)
from dlrfeed.errors import ConfigError


def _parsers() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser = argparse.ArgumentParser(prog="dlrfeed")
    subparsers = parser.add_subparsers(dest="command", required=True)
    run = subparsers.add_parser("run")
    run.add_argument("--config")
    run.add_argument("--streams", type=int, default=2)
    run.add_argument("--mode", choices=["auto", "subscribe", "pull"], default="auto")
    run.add_argument("--tls", action="store_true")
    run.add_argument("--database-url", default=None)
    return parser, {"run": run}


def test_flag_beats_env_beats_file_beats_default(tmp_path: Path) -> None:
    config = tmp_path / "dlrfeed.toml"
    config.write_text('streams = 5\nmode = "pull"\ndatabase-url = "postgresql://file"\n')
    env = {"DLRFEED_MODE": "subscribe", "DLRFEED_DATABASE_URL": "postgresql://env"}
    parser, subs = _parsers()
    args = LayeredDefaults(parser, subs, env).parse(
        ["run", "--config", str(config), "--database-url=postgresql://flag"]
    )
    assert args.database_url == "postgresql://flag"
    assert args.mode == "subscribe"
    assert args.streams == 5
    assert args.tls is False
    assert args._sources == {
        "database_url": "flag",
        "mode": "env",
        "streams": "config",
        "tls": "default",
    }


def test_env_values_go_through_the_option_type() -> None:
    parser, subs = _parsers()
    args = LayeredDefaults(parser, subs, {"DLRFEED_STREAMS": "4", "DLRFEED_TLS": "yes"}).parse(
        ["run"]
    )
    assert args.streams == 4
    assert args.tls is True


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"DLRFEED_STREAMS": "many"}, "--streams from env DLRFEED_STREAMS"),
        ({"DLRFEED_MODE": "webhook"}, "'webhook' is not one of auto, subscribe, pull"),
        ({"DLRFEED_TLS": "maybe"}, "expected true or false"),
    ],
)
def test_bad_env_value_is_one_clear_line(env: dict[str, str], message: str) -> None:
    parser, subs = _parsers()
    with pytest.raises(ConfigError, match=message) as info:
        LayeredDefaults(parser, subs, env).parse(["run"])
    assert "\n" not in str(info.value)


def test_unknown_or_unreadable_config_file_is_an_error(tmp_path: Path) -> None:
    parser, subs = _parsers()
    bad = tmp_path / "bad.toml"
    bad.write_text("stremas = 3\n")
    with pytest.raises(ConfigError, match=r"unknown setting\(s\) \['stremas'\]"):
        LayeredDefaults(parser, subs, {}).parse(["run", "--config", str(bad)])
    with pytest.raises(ConfigError, match="cannot read config file"):
        LayeredDefaults(parser, subs, {}).parse(["run", "--config", str(tmp_path / "none")])
    broken = tmp_path / "broken.toml"
    broken.write_text("streams = = 3\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        LayeredDefaults(parser, subs, {}).parse(["run", "--config", str(broken)])


def test_integration_rules_are_off_by_default_and_one_set_for_both_commands() -> None:
    """P18: the rules are switched on explicitly, with the same flags for run and
    record-submissions (ingest and late correlation must agree)."""
    from dlrfeed.cli import build_parser
    from dlrfeed.config import integration_options
    from dlrfeed.domain.options import IntegrationOptions

    parser, subs = build_parser()
    base = ["--database-url", "postgresql://x@y/z"]
    default = LayeredDefaults(parser, subs, {}).parse(["record-submissions", "-", *base])
    assert integration_options(default) == IntegrationOptions()
    for command in ("run", "record-submissions"):
        argv = [command, *(["-"] if command == "record-submissions" else []), *base]
        args = LayeredDefaults(parser, subs, {"DLRFEED_RECEIPT_IDS_HEX": "1"}).parse(
            [*argv, "--deadline-unknown-superseded", "--receipt-timezone", "Europe/Madrid"]
        )
        assert integration_options(args) == IntegrationOptions(
            deadline_unknown_superseded=True,
            receipt_ids_hex=True,
            receipt_timezone="Europe/Madrid",
        )
    bad = LayeredDefaults(parser, subs, {}).parse(
        ["record-submissions", "-", *base, "--receipt-timezone", "Mars/Olympus"]
    )
    with pytest.raises(ConfigError, match="--receipt-timezone"):
        integration_options(bad)


@pytest.mark.parametrize(
    ("convert", "text", "message"),
    [
        (positive_int, "0", "must be at least 1, got 0"),
        (positive_int, "1.5", "expected a whole number, got '1.5'"),
        (non_negative_int, "-1", "must not be negative, got -1"),
        (positive_float, "0", "must be above 0, got 0.0"),
        (non_negative_float, "-0.5", "must not be negative, got -0.5"),
        (non_negative_float, "soon", "expected a number, got 'soon'"),
    ],
)
def test_a_numeric_option_out_of_range_says_what_it_needs(
    convert: Callable[[str], float], text: str, message: str
) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=re.escape(message)):
        convert(text)


def test_numeric_options_accept_their_bounds() -> None:
    assert (positive_int("1"), non_negative_int("0")) == (1, 0)
    assert (positive_float("0.001"), non_negative_float("0")) == (0.001, 0.0)
