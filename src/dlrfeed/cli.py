"""The `dlrfeed` command line: one sub-command per module of `dlrfeed.commands`.

Every option of every sub-command can also come from the environment (`DLRFEED_<OPTION>`, upper
case, `-` → `_`) or from a TOML file given with `--config`; a flag wins over the environment,
the environment over the file, the file over the built-in default (docs/spec/interfaces.md §3).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Protocol, cast

from dlrfeed import __version__
from dlrfeed.config import LayeredDefaults
from dlrfeed.errors import DlrfeedError

# sub-command name → module under dlrfeed.commands
COMMANDS: dict[str, str] = {
    "migrate": "migrate",
    "run": "run",
    "check-config": "check_config",
    "record-submissions": "record_submissions",
    "record-verifications": "record_verifications",
    "show": "show",
    "exceptions": "exceptions",
    "stats": "stats",
    "quality": "quality",
    "changes": "changes",
    "relay": "relay",
    "maintain": "maintain",
    "recompute": "recompute",
    "webhook": "webhook",
}


class Command(Protocol):
    """What a module of `dlrfeed.commands` provides."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    async def run(self, args: argparse.Namespace) -> int: ...


def _load(module_name: str) -> Command:
    module: ModuleType = importlib.import_module(f"dlrfeed.commands.{module_name}")
    return cast(Command, module)


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The top-level parser and each sub-command's parser, by name."""
    parser = argparse.ArgumentParser(
        prog="dlrfeed",
        description="Drain an SMS gateway's delivery receipts (its feed, or its HTTP callbacks) "
        "into PostgreSQL.",
    )
    parser.add_argument("--version", action="version", version=f"dlrfeed {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    by_name: dict[str, argparse.ArgumentParser] = {}
    for name, module_name in COMMANDS.items():
        command = _load(module_name)
        doc = (command.__doc__ or "").strip().splitlines()
        sub = subparsers.add_parser(
            name, help=doc[0] if doc else None, description=doc[0] if doc else None
        )
        sub.add_argument(
            "--config", metavar="FILE", help="TOML file of settings (flags and env win)"
        )
        command.add_arguments(sub)
        sub.set_defaults(_command=command)
        by_name[name] = sub
    return parser, by_name


def _loop_factory(command: Command) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop for a command that asks for it (`LOOP_FACTORY = "uvloop"`), when installed."""
    if getattr(command, "LOOP_FACTORY", None) != "uvloop":
        return None
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `dlrfeed` console script."""
    parser, subparsers = build_parser()
    arguments = list(sys.argv[1:] if argv is None else argv)
    try:
        args = LayeredDefaults(parser, subparsers).parse(arguments)
    except DlrfeedError as exc:
        print(f"dlrfeed: {exc}", file=sys.stderr)
        return exc.exit_code
    command = cast(Command, args._command)
    try:
        with asyncio.Runner(loop_factory=_loop_factory(command)) as runner:
            return runner.run(command.run(args))
    except DlrfeedError as exc:
        print(f"dlrfeed: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
