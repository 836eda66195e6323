"""A secret a command takes from a file, the environment or a systemd credential, never argv.

`ps`, shell history and the unit file would show a secret given as a flag, so `--secret` exists
only to be refused (without echoing the value), and the value comes from `--secret-file FILE`,
an environment variable, or `$CREDENTIALS_DIRECTORY/<credential>` (systemd's LoadCredential=),
in that order. The relay signs with one; the webhook receiver checks callers against one.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from dlrfeed.errors import ConfigError


@dataclass(frozen=True)
class SecretOption:
    """Where one command's secret may come from: `env` and the systemd `credential` name."""

    what: str
    """How errors name it, e.g. "relay secret"."""
    env: str
    credential: str

    @property
    def refused_on_argv(self) -> str:
        return (
            f"refused: the {self.what} is never accepted on the command line (ps, shell "
            f"history); use --secret-file FILE, {self.env} or the systemd credential "
            f"`{self.credential}`"
        )

    def add_to(self, parser: argparse.ArgumentParser, purpose: str) -> None:
        """`--secret-file` (help: "file holding `purpose`") and the refused `--secret`."""
        parser.allow_abbrev = False  # no `--secret` → --secret-file guessing
        parser.add_argument(
            "--secret-file",
            metavar="FILE",
            help=f"file holding {purpose} (else {self.env}, else "
            f"$CREDENTIALS_DIRECTORY/{self.credential}); never accepted on the command line",
        )
        message = self.refused_on_argv
        parser.add_argument(
            "--secret", action=refusing_action(message), nargs="?", metavar="-", help=message
        )

    def find(self, secret_file: str | None, environ: Mapping[str, str]) -> tuple[bytes, str] | None:
        """(secret, where it came from), or None when no source gives one."""
        if secret_file:
            return _read_secret(Path(secret_file), "--secret-file"), f"file {secret_file}"
        if environ.get(self.env):
            return environ[self.env].encode(), f"env {self.env}"
        credentials = environ.get("CREDENTIALS_DIRECTORY")
        if credentials and (Path(credentials) / self.credential).exists():
            path = Path(credentials) / self.credential
            return _read_secret(path, "systemd credential"), f"systemd credential {self.credential}"
        return None

    def resolve(self, secret_file: str | None, environ: Mapping[str, str]) -> tuple[bytes, str]:
        """As `find`, but a missing secret is a one-line ConfigError naming every source."""
        found = self.find(secret_file, environ)
        if found is None:
            raise ConfigError(
                f"no {self.what}: give --secret-file FILE, {self.env}, or the systemd "
                f"credential `{self.credential}` (LoadCredential={self.credential}:FILE)"
            )
        return found


def refusing_action(message: str) -> type[argparse.Action]:
    """An argparse action that refuses its option with `message` without echoing the value
    (argparse would print an unknown option's value, and the option would otherwise abbreviate
    its `-file` sibling)."""

    class RefuseOnArgv(argparse.Action):
        def __call__(
            self,
            parser: argparse.ArgumentParser,
            namespace: argparse.Namespace,
            values: object,
            option_string: str | None = None,
        ) -> None:
            raise argparse.ArgumentError(self, message)

    return RefuseOnArgv


def _read_secret(path: Path, what: str) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror}") from None
    secret = data.rstrip(b"\r\n")
    if not secret:
        raise ConfigError(f"{what} {path} is empty")
    return secret
