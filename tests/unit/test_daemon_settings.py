"""`dlrfeed run` settings: window/lease checks, the password's sources, redaction,
one-line configuration errors, sd_notify."""

from __future__ import annotations

import argparse
import socket
from pathlib import Path

import pytest

from dlrfeed.cli import build_parser, main
from dlrfeed.config import LayeredDefaults
from dlrfeed.daemon.sdnotify import SystemdNotifier
from dlrfeed.daemon.settings import DaemonSettings, check_window, redact_url
from dlrfeed.errors import ConfigError
from dlrfeed.feed.client import FeedClient
from dlrfeed_tools.daemon_harness import PASSWORD, settings_for

GW = "127.0.0.1:1"
DB = "postgresql://app:dbsecret@127.0.0.1:5/x"


@pytest.mark.parametrize(
    ("batch", "ack", "window", "fragment"),
    [
        (800, 500, 1000, "stall at its window"),
        (500, 1001, 1000, "Ack limit of 1000"),
        (1001, 10, 1000, "Pull limit"),
        (100, 100, 2000, "gateway's maximum"),
    ],
)
def test_settings_that_could_stall_a_stream_are_refused(
    batch: int, ack: int, window: int, fragment: str
) -> None:
    """F11/F9/F10: refused at start with one line saying what to change."""
    with pytest.raises(ConfigError) as caught:
        check_window(batch, ack, window)
    assert fragment in str(caught.value)
    assert "\n" not in str(caught.value)


def test_defaults_pass_the_window_check() -> None:
    """The documented defaults are consistent with F11."""
    parser, subparsers = build_parser()
    argv = ["run", "--gateway", GW, "--login", "a", "--database-url", DB]
    env = {"DLRFEED_PASSWORD": PASSWORD}
    settings = DaemonSettings.from_args(LayeredDefaults(parser, subparsers, env).parse(argv), env)
    assert settings.batch_size + settings.ack_batch <= settings.window
    assert (settings.streams, settings.processes, settings.mode.value) == (2, 1, "auto")
    assert settings.ack_batch == 500
    assert settings.ack_linger == pytest.approx(0.05)


def test_release_after_must_be_shorter_than_the_lease() -> None:
    """F6/F7: releasing after the lease has run out is pointless."""
    with pytest.raises(ConfigError, match="shorter than the lease"):
        settings_for(GW, DB, "--release-after", "200")


def test_password_from_file_env_or_systemd_credential(tmp_path: Path) -> None:
    """FD1: --password-file, then DLRFEED_PASSWORD, then $CREDENTIALS_DIRECTORY/password."""
    secret_file = tmp_path / "pw"
    secret_file.write_text("from-file\n")
    assert settings_for(GW, DB, "--password-file", str(secret_file), environ={}).password == (
        "from-file"
    )
    assert settings_for(GW, DB, environ={"DLRFEED_PASSWORD": "from-env"}).password == "from-env"
    (tmp_path / "password").write_text("from-credential")
    from_systemd = settings_for(GW, DB, environ={"CREDENTIALS_DIRECTORY": str(tmp_path)})
    assert from_systemd.password == "from-credential"
    assert from_systemd.password_source == "systemd credential password"
    with pytest.raises(ConfigError, match="no gateway password"):
        settings_for(GW, DB, environ={})


@pytest.mark.parametrize("spelling", [["--password", PASSWORD], [f"--password={PASSWORD}"]])
def test_password_is_never_accepted_on_the_command_line(
    spelling: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """FD1: the password on argv (visible in ps, shell history) is refused, without echoing it."""
    with pytest.raises(SystemExit) as caught:
        settings_for(GW, DB, *spelling)
    err = capsys.readouterr().err
    assert caught.value.code == 2
    assert "never accepted on the command line" in err
    assert PASSWORD not in err


def test_secrets_stay_out_of_reprs_and_urls() -> None:
    """The settings' repr, the client's repr and a logged URL carry no secret."""
    settings = settings_for(GW, DB)
    assert PASSWORD not in repr(settings)
    assert "dbsecret" not in redact_url(DB)
    assert redact_url(DB) == "postgresql://app:<redacted>@127.0.0.1:5/x"
    assert PASSWORD not in repr(FeedClient.__new__(FeedClient))


def test_check_config_prints_sources_and_redacts(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`dlrfeed check-config` shows every setting with its source, secrets redacted."""
    config = tmp_path / "dlrfeed.toml"
    config.write_text('streams = 4\nmode = "pull"\n')
    monkeypatch.setenv("DLRFEED_PASSWORD", PASSWORD)
    monkeypatch.setenv("DLRFEED_DATABASE_URL", DB)
    code = main(
        ["check-config", "--config", str(config), "--gateway", GW, "--login", "acme",
         "--batch-size", "300"]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert PASSWORD not in out
    assert "dbsecret" not in out
    lines = {line.split()[0]: line for line in out.splitlines()}
    assert lines["--batch-size"].endswith("(flag)")
    assert lines["--database-url"].endswith("(env)")
    assert lines["--streams"].endswith("(config)")
    assert lines["--window"].endswith("(default)")
    assert "env DLRFEED_PASSWORD" in lines["password"]


def test_check_config_rejects_bad_settings_with_exit_78(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Invalid configuration → exit 78 (EX_CONFIG) with one line."""
    monkeypatch.setenv("DLRFEED_PASSWORD", PASSWORD)
    code = main(["check-config", "--gateway", GW, "--login", "a", "--database-url", DB,
                 "--ack-batch", "2000"])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert code == 78
    assert len(err.splitlines()) == 1
    assert "--ack-batch" in err


def test_sd_notify_sends_one_datagram(tmp_path: Path) -> None:
    """READY/STATUS reach $NOTIFY_SOCKET; WATCHDOG_USEC sets a half interval."""
    path = str(tmp_path / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind(path)
        notifier = SystemdNotifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "4000000"})
        notifier.notify(READY="1", STATUS="draining")
        assert server.recv(1024) == b"READY=1\nSTATUS=draining"
    assert notifier.watchdog_interval == pytest.approx(2.0)
    assert not SystemdNotifier({}).enabled


def test_namespace_without_sources_is_not_needed() -> None:
    """The settings model is argparse: an unknown mode is refused by its choices."""
    with pytest.raises((SystemExit, ConfigError, argparse.ArgumentError)):
        settings_for(GW, DB, "--mode", "carrier-pigeon")
