"""`dlrfeed webhook` settings: who may post without a secret, where the secret comes from, and
one-line errors for what cannot work."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlrfeed.errors import ConfigError
from dlrfeed.webhook.formats import CallbackFormat
from dlrfeed.webhook.settings import WEBHOOK_SECRET, is_loopback
from support.webhook_harness import SECRET, webhook_settings

DB = "postgresql://127.0.0.1:1/x"


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),  # noqa: S104 - the address under test, not a bind
        ("::", False),
        ("10.0.0.5", False),
        ("receiver.example.net", False),
    ],
)
def test_loopback_is_this_machine_only(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_without_a_secret_only_loopback_is_served_unless_told_otherwise() -> None:
    """Nobody else may post unauthenticated callbacks into the evidence unless the operator
    says the network in front is trusted."""
    assert webhook_settings(DB).secret is None
    with pytest.raises(ConfigError, match="reachable from the network and no secret"):
        webhook_settings(DB, "--listen", "0.0.0.0:8080")
    open_settings = webhook_settings(DB, "--listen", "0.0.0.0:8080", "--allow-unauthenticated")
    assert open_settings.listen == ("0.0.0.0", 8080)  # noqa: S104 - what was asked for


def test_the_secret_comes_from_a_file_the_environment_or_a_credential(tmp_path: Path) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_text(SECRET + "\n")
    from_file = webhook_settings(DB, "--listen", "0.0.0.0:8080", "--secret-file", str(secret_file))
    assert from_file.secret == SECRET.encode()
    assert from_file.secret_file_mode is not None  # written 0644 here: the service warns
    from_env = webhook_settings(DB, environ={WEBHOOK_SECRET.env: "from-env"})
    assert (from_env.secret, from_env.secret_source) == (b"from-env", f"env {WEBHOOK_SECRET.env}")
    (tmp_path / WEBHOOK_SECRET.credential).write_text("from-credential")
    from_credential = webhook_settings(DB, environ={"CREDENTIALS_DIRECTORY": str(tmp_path)})
    assert from_credential.secret == b"from-credential"
    assert SECRET not in repr(from_file)


def test_the_secret_is_never_an_option(tmp_path: Path) -> None:
    config = tmp_path / "webhook.toml"
    config.write_text('secret = "x"\n')
    with pytest.raises(ConfigError, match="config file sets `secret`"):
        webhook_settings(DB, "--config", str(config))


def test_defaults_and_the_format() -> None:
    settings = webhook_settings(DB, "--format", "kannel")
    assert settings.callback_format is CallbackFormat.KANNEL
    assert settings.max_body_bytes == 64 * 1024
    assert settings.db_pool_size == settings.commits + 1
    with pytest.raises(SystemExit):
        webhook_settings(DB, "--format", "smpp")
