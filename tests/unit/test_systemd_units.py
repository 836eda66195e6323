"""The shipped systemd units: valid, hardened, and in step with the daemon.

`systemd-analyze` works offline on unit files, as root, without a running systemd. `verify`
insists that ExecStart= names an existing executable, so each unit is staged in a temporary
directory with the install path (/opt/dlrfeed/venv/bin/dlrfeed) pointed at a stub script.
A machine without `systemd-analyze` fails these tests on purpose: `make install` provides it
(Debian package `systemd`), and a skipped check would let an unverified unit ship.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from unittest import mock

import pytest

from dlrfeed.cli import build_parser
from dlrfeed.config import env_name, settable_actions
from dlrfeed.errors import AuthenticationError, ConfigError, SchemaOutOfDateError
from support.webhook_harness import webhook_settings

SYSTEMD_DIR = Path(__file__).resolve().parents[2] / "systemd"
INSTALLED_EXECUTABLE = "/opt/dlrfeed/venv/bin/dlrfeed"
UNITS = [
    "dlrfeed.service",
    "dlrfeed@.service",
    "dlrfeed-migrate.service",
    "dlrfeed-relay.service",
    "dlrfeed-maintain.service",
    "dlrfeed-webhook.service",
]
DAEMON_UNITS = ["dlrfeed.service", "dlrfeed@.service"]
MAX_EXPOSURE = 1.5
# `dlrfeed run --shutdown-timeout` default; TimeoutStopSec= must outlast it.
DAEMON_SHUTDOWN_TIMEOUT_S = 30
HARDENING_MARKER = "# --- hardening"

UnitFile = dict[str, list[tuple[str, str]]]


def _parse_unit(text: str) -> UnitFile:
    """Sections → ordered (key, value) pairs; unit files repeat keys, so no configparser."""
    sections: UnitFile = {}
    current: list[tuple[str, str]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
            continue
        key, _, value = line.partition("=")
        current.append((key.strip(), value.strip()))
    return sections


def _values(unit: UnitFile, section: str, key: str) -> list[str]:
    return [value for name, value in unit.get(section, []) if name == key]


def _only(unit: UnitFile, section: str, key: str) -> str:
    values = _values(unit, section, key)
    assert len(values) == 1, f"[{section}] {key}= expected once, found {values}"
    return values[0]


def _seconds(value: str) -> float:
    """A systemd time span as seconds: `45`, `45s`, `1min 30s`, `15min`."""
    units = {"": 1, "s": 1, "sec": 1, "min": 60, "m": 60, "h": 3600}
    total = 0.0
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value):
        total += float(number) * units[unit]
    return total


def _unit(name: str) -> UnitFile:
    return _parse_unit((SYSTEMD_DIR / name).read_text())


def _hardening_block(name: str) -> list[str]:
    text = (SYSTEMD_DIR / name).read_text()
    assert HARDENING_MARKER in text, f"{name} has no '{HARDENING_MARKER}' block"
    block = text.split(HARDENING_MARKER, 1)[1].split("\n[", 1)[0]
    return [line for line in block.splitlines()[1:] if line and not line.startswith("#")]


@pytest.fixture(scope="module")
def systemd_analyze() -> str:
    """Path of systemd-analyze; its absence is a failure, not a skip (see module docstring)."""
    path = shutil.which("systemd-analyze")
    if path is None:
        pytest.fail(
            "systemd-analyze not found: install Debian's `systemd` package "
            "(apt-get install systemd; `make install` does it) to check the systemd units"
        )
    return path


def _stage(unit_name: str, directory: Path) -> Path:
    """Copy a unit to `directory` with ExecStart= pointed at an existing stub executable."""
    stub = directory / "dlrfeed"
    if not stub.exists():
        stub.write_text("#!/bin/sh\nexit 0\n")
        stub.chmod(0o755)
    text = (SYSTEMD_DIR / unit_name).read_text()
    assert INSTALLED_EXECUTABLE in text, f"{unit_name} does not run {INSTALLED_EXECUTABLE}"
    staged = directory / unit_name
    staged.write_text(text.replace(INSTALLED_EXECUTABLE, str(stub)))
    return staged


@pytest.mark.parametrize("unit_name", UNITS)
def test_unit_passes_systemd_analyze_verify(
    unit_name: str, systemd_analyze: str, tmp_path: Path
) -> None:
    """`systemd-analyze verify` accepts the unit with no warning at all."""
    staged = _stage(unit_name, tmp_path)
    result = subprocess.run(
        [systemd_analyze, "verify", "--man=no", "--generators=no", str(staged)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    # Unknown keys and unparsable values are only logged; any line naming the unit is a defect.
    complaints = [
        line for line in (result.stdout + result.stderr).splitlines() if str(staged) in line
    ]
    assert result.returncode == 0, result.stdout + result.stderr
    assert complaints == []


@pytest.mark.parametrize("unit_name", UNITS)
def test_unit_exposure_is_at_most_1_5(unit_name: str, systemd_analyze: str, tmp_path: Path) -> None:
    """`systemd-analyze security --offline=yes` scores exposure <= 1.5."""
    staged = _stage(unit_name, tmp_path)
    result = subprocess.run(
        [systemd_analyze, "security", "--offline=yes", "--no-pager", str(staged)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    match = re.search(r"Overall exposure level for \S+: (\d+(?:\.\d+)?)", result.stdout)
    assert match is not None, result.stdout + result.stderr
    exposure = float(match.group(1))
    assert exposure <= MAX_EXPOSURE, result.stdout


def test_every_unit_carries_the_same_hardening() -> None:
    """The template and the migration are sandboxed exactly like dlrfeed.service (no drift)."""
    reference = _hardening_block("dlrfeed.service")
    assert "ProtectSystem=strict" in reference
    for name in UNITS[1:]:
        assert _hardening_block(name) == reference, name


@pytest.mark.parametrize("unit_name", DAEMON_UNITS)
def test_daemon_unit_is_notify_with_watchdog_and_bounded_restarts(unit_name: str) -> None:
    """Type=notify with the watchdog; restarts on failure but at a bounded rate."""
    unit = _unit(unit_name)
    assert _only(unit, "Service", "Type") == "notify"
    assert _only(unit, "Service", "NotifyAccess") == "main"
    assert _seconds(_only(unit, "Service", "WatchdogSec")) == 30
    assert _only(unit, "Service", "Restart") == "on-failure"
    assert _seconds(_only(unit, "Service", "RestartSec")) > 0
    assert int(_only(unit, "Unit", "StartLimitBurst")) > 0
    assert _seconds(_only(unit, "Unit", "StartLimitIntervalSec")) > 0
    # Migrations run as the owner role, in dlrfeed-migrate.service, never before each start.
    assert _values(unit, "Service", "ExecStartPre") == []
    assert "dlrfeed-migrate.service" in _only(unit, "Unit", "After").split()


@pytest.mark.parametrize("unit_name", DAEMON_UNITS)
def test_fatal_exit_codes_do_not_restart(unit_name: str) -> None:
    """interfaces §3: a fatal exit (bad config, stale schema, refused login) is not restarted."""
    unit = _unit(unit_name)
    prevented = {int(code) for code in _only(unit, "Service", "RestartPreventExitStatus").split()}
    fatal_codes = {
        ConfigError.exit_code,
        SchemaOutOfDateError.exit_code,
        AuthenticationError.exit_code,
    }
    assert fatal_codes <= prevented
    assert prevented == {77, 78}


@pytest.mark.parametrize("unit_name", DAEMON_UNITS)
def test_stop_timeout_outlasts_the_daemons_clean_shutdown(unit_name: str) -> None:
    """F7: systemd must not SIGKILL the daemon while it commits and flushes acks."""
    unit = _unit(unit_name)
    assert _only(unit, "Service", "KillSignal") == "SIGTERM"
    assert _seconds(_only(unit, "Service", "TimeoutStopSec")) > DAEMON_SHUTDOWN_TIMEOUT_S


@pytest.mark.parametrize(
    ("unit_name", "credential"),
    [
        ("dlrfeed.service", "password:/etc/dlrfeed/password"),
        ("dlrfeed@.service", "password:/etc/dlrfeed/%i.password"),
    ],
)
def test_password_arrives_as_a_credential_file(unit_name: str, credential: str) -> None:
    """The password is a systemd credential read from $CREDENTIALS_DIRECTORY, never env text."""
    unit = _unit(unit_name)
    assert _values(unit, "Service", "LoadCredential") == [credential]
    environment = " ".join(_values(unit, "Service", "Environment"))
    assert "DLRFEED_PASSWORD_FILE=%d/password" in environment.split()
    assert "DLRFEED_PASSWORD=" not in environment


def test_template_instance_picks_its_own_files() -> None:
    """dlrfeed@NAME reads /etc/dlrfeed/NAME.env on top of the shared file."""
    unit = _unit("dlrfeed@.service")
    assert _values(unit, "Service", "EnvironmentFile") == [
        "-/etc/dlrfeed/dlrfeed.env",
        "/etc/dlrfeed/%i.env",
    ]


def _example_keys(name: str) -> set[str]:
    """Every DLRFEED_* key an example env file sets or shows commented out."""
    text = (SYSTEMD_DIR / name).read_text()
    return set(re.findall(r"^#?(DLRFEED_[A-Z0-9_]+)=", text, flags=re.MULTILINE))


@pytest.mark.parametrize(
    ("command", "files"),
    [
        ("run", ["dlrfeed.env.example"]),
        ("migrate", ["migrate.env.example"]),
        ("relay", ["relay.env.example"]),
        ("webhook", ["webhook.env.example"]),
        ("maintain", ["migrate.env.example", "maintain.env.example"]),
    ],
)
def test_example_env_files_name_real_options(command: str, files: list[str]) -> None:
    """interfaces §3: each DLRFEED_* in the examples (and the units) is a command option."""
    _, subparsers = build_parser()
    known = {env_name(action.dest) for action in settable_actions(subparsers[command])}
    shown: set[str] = set()
    for name in files:
        shown |= _example_keys(name)
    if command == "run":
        shown.add("DLRFEED_PASSWORD_FILE")  # set by the daemon units themselves
    if command in ("relay", "webhook"):
        shown.add("DLRFEED_SECRET_FILE")  # set by the relay and webhook units themselves
    assert shown - known == set()


def test_relay_unit_takes_its_secret_as_a_credential_and_restarts_like_the_daemon() -> None:
    """dlrfeed-relay.service: the HMAC secret is a credential file, never environment text;
    Type=notify with the watchdog; fatal exits are not restarted; its env file is required."""
    unit = _unit("dlrfeed-relay.service")
    assert _values(unit, "Service", "LoadCredential") == ["relay-secret:/etc/dlrfeed/relay-secret"]
    environment = " ".join(_values(unit, "Service", "Environment")).split()
    assert "DLRFEED_SECRET_FILE=%d/relay-secret" in environment
    assert not any(item.startswith("DLRFEED_RELAY_SECRET=") for item in environment)
    assert _only(unit, "Service", "ExecStart") == f"{INSTALLED_EXECUTABLE} relay"
    assert _only(unit, "Service", "Type") == "notify"
    assert _seconds(_only(unit, "Service", "WatchdogSec")) == 30
    assert _only(unit, "Service", "Restart") == "on-failure"
    assert {int(c) for c in _only(unit, "Service", "RestartPreventExitStatus").split()} == {
        ConfigError.exit_code,
        AuthenticationError.exit_code,
    }
    assert _values(unit, "Service", "EnvironmentFile") == ["/etc/dlrfeed/relay.env"]
    assert "DLRFEED_RELAY_SECRET" not in _example_keys("relay.env.example")


def test_maintain_runs_as_the_owner_daily_writing_only_its_state_directory(
    systemd_analyze: str, tmp_path: Path
) -> None:
    """Retention (docs/retention.md): the timer starts the oneshot daily and catches up a missed
    run; the service takes the owner's URL, and archives may go only to its state directory."""
    service = _unit("dlrfeed-maintain.service")
    assert _only(service, "Service", "Type") == "oneshot"
    assert _only(service, "Service", "ExecStart") == f"{INSTALLED_EXECUTABLE} maintain"
    assert "/etc/dlrfeed/migrate.env" in _values(service, "Service", "EnvironmentFile")
    assert _only(service, "Service", "StateDirectory") == "dlrfeed-maintain"
    assert _only(service, "Service", "User") == _only(
        _unit("dlrfeed-migrate.service"), "Service", "User"
    )  # peer authentication maps the same system user to the owner role
    timer = _parse_unit((SYSTEMD_DIR / "dlrfeed-maintain.timer").read_text())
    assert _only(timer, "Timer", "Unit") == "dlrfeed-maintain.service"
    assert _only(timer, "Timer", "Persistent") == "yes"
    assert _only(timer, "Timer", "OnCalendar").startswith("*-*-* ")
    assert _only(timer, "Install", "WantedBy") == "timers.target"
    _stage("dlrfeed-maintain.service", tmp_path)
    staged_timer = tmp_path / "dlrfeed-maintain.timer"
    staged_timer.write_text((SYSTEMD_DIR / "dlrfeed-maintain.timer").read_text())
    result = subprocess.run(
        [systemd_analyze, "verify", "--man=no", "--generators=no", str(staged_timer)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    complaints = [
        line for line in (result.stdout + result.stderr).splitlines() if str(tmp_path) in line
    ]
    assert result.returncode == 0, result.stdout + result.stderr
    assert complaints == []


def test_webhook_unit_takes_its_secret_as_a_credential_and_outlasts_its_clean_stop() -> None:
    """dlrfeed-webhook.service: the callers' secret is a credential file, never environment
    text; Type=notify with the watchdog; fatal exits are not restarted; a stop has time to
    answer the callbacks in progress after their commit (--shutdown-timeout)."""
    unit = _unit("dlrfeed-webhook.service")
    assert _values(unit, "Service", "LoadCredential") == [
        "webhook-secret:/etc/dlrfeed/webhook-secret"
    ]
    environment = " ".join(_values(unit, "Service", "Environment")).split()
    assert "DLRFEED_SECRET_FILE=%d/webhook-secret" in environment
    assert not any(item.startswith("DLRFEED_WEBHOOK_SECRET=") for item in environment)
    assert _only(unit, "Service", "ExecStart") == f"{INSTALLED_EXECUTABLE} webhook"
    assert _only(unit, "Service", "Type") == "notify"
    assert _seconds(_only(unit, "Service", "WatchdogSec")) == 30
    assert {int(c) for c in _only(unit, "Service", "RestartPreventExitStatus").split()} == {
        ConfigError.exit_code,
        AuthenticationError.exit_code,
    }
    _, subparsers = build_parser()
    (timeout,) = [a.default for a in subparsers["webhook"]._actions if a.dest == "shutdown_timeout"]
    assert _seconds(_only(unit, "Service", "TimeoutStopSec")) > timeout
    assert _values(unit, "Service", "EnvironmentFile") == ["/etc/dlrfeed/webhook.env"]
    assert "DLRFEED_WEBHOOK_SECRET" not in _example_keys("webhook.env.example")


def test_webhook_unit_has_descriptors_and_memory_for_its_bounds() -> None:
    """The connection cap's default fits under LimitNOFILE (with the descriptors it keeps
    back), so a flood meets the cap and not EMFILE; the bodies in flight fit in MemoryMax."""
    unit = _unit("dlrfeed-webhook.service")
    limit = int(_only(unit, "Service", "LimitNOFILE"))
    with mock.patch("resource.getrlimit", return_value=(limit, limit)):
        settings = webhook_settings("postgresql://u@h/d")
    assert settings.max_connections == 4096 <= limit - 64
    memory = _only(unit, "Service", "MemoryMax")
    assert memory.endswith("M")
    assert settings.max_bodies_bytes * 2 < int(memory[:-1]) * 1024 * 1024
