#!/usr/bin/env bash
# Makes sure the machine has the system programs the project runs against for real:
# - PostgreSQL's server binaries (initdb, pg_ctl, postgres), for throwaway test/demo clusters;
# - systemd-analyze, with which the tests verify and score the shipped systemd units;
# - promtool (Debian's prometheus package), with which the tests check the alert rules.
# - pgbouncer, the transaction pooler the integration tests run the daemon through.
# - nginx, the TLS reverse proxy docs/webhook.md puts in front of `dlrfeed webhook`: the tests
#   run the documented configuration for real.
# - kannel (bearerbox, smsbox), the SMS gateway whose dlr-url the tests point at
#   `dlrfeed webhook --format kannel`, over SMPP to a simulated SMSC.
# - wrk, the HTTP load generator that posts the callback benchmark's callbacks (its script is
#   tested in the suite).
# Installs Debian's packages when they are absent and we may (root); otherwise says exactly
# what is missing. Throwaway clusters themselves are started by scripts/pgcluster.py.
set -euo pipefail

have_postgres() {
  local dir
  dir=$(pg_config --bindir 2>/dev/null || true)
  if [ -n "$dir" ] && [ -x "$dir/initdb" ]; then return 0; fi
  compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null
}

have_systemd_analyze() { command -v systemd-analyze >/dev/null; }

have_promtool() { command -v promtool >/dev/null; }
have_pgbouncer() { command -v pgbouncer >/dev/null || [ -x /usr/sbin/pgbouncer ]; }
have_nginx() { command -v nginx >/dev/null || [ -x /usr/sbin/nginx ]; }
have_wrk() { command -v wrk >/dev/null; }
have_kannel() {
  { command -v bearerbox >/dev/null || [ -x /usr/sbin/bearerbox ]; } &&
    { command -v smsbox >/dev/null || [ -x /usr/sbin/smsbox ]; }
}

missing=()
have_postgres || missing+=(postgresql)
have_systemd_analyze || missing+=(systemd)
have_promtool || missing+=(prometheus)
have_pgbouncer || missing+=(pgbouncer)
have_nginx || missing+=(nginx)
have_kannel || missing+=(kannel)
have_wrk || missing+=(wrk)
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
  echo "missing system packages: ${missing[*]} (Debian: sudo apt-get install ${missing[*]})" >&2
  exit 1
fi
echo "installing system packages: ${missing[*]} (apt-get)..." >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# policy-rc.d keeps package scripts from starting services in this container.
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
  trap 'rm -f /usr/sbin/policy-rc.d' EXIT
fi
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
have_postgres || { echo "postgresql installed but initdb still not found" >&2; exit 1; }
have_systemd_analyze || { echo "systemd installed but systemd-analyze not found" >&2; exit 1; }
have_promtool || { echo "prometheus installed but promtool not found" >&2; exit 1; }
have_pgbouncer || { echo "pgbouncer installed but its binary not found" >&2; exit 1; }
have_nginx || { echo "nginx installed but its binary not found" >&2; exit 1; }
have_kannel || { echo "kannel installed but bearerbox or smsbox not found" >&2; exit 1; }
have_wrk || { echo "wrk installed but its binary not found" >&2; exit 1; }
