#!/usr/bin/env bash
# Makes sure PostgreSQL's server binaries are on this machine (initdb, pg_ctl, postgres).
# Installs Debian's `postgresql` package when they are absent and we may (root); otherwise
# says exactly what is missing. Throwaway clusters are started by scripts/pgcluster.py.
set -euo pipefail

have_server() {
  local dir
  dir=$(pg_config --bindir 2>/dev/null || true)
  if [ -n "$dir" ] && [ -x "$dir/initdb" ]; then return 0; fi
  compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null
}

if have_server; then exit 0; fi
if [ "$(id -u)" -ne 0 ]; then
  echo "PostgreSQL server binaries not found; install them (Debian: sudo apt-get install postgresql)" >&2
  exit 1
fi
echo "installing the PostgreSQL server (apt-get install postgresql)..." >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends postgresql >/dev/null
have_server || { echo "PostgreSQL installed but initdb still not found" >&2; exit 1; }
