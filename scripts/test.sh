#!/usr/bin/env bash
# Install what the tests need into .venv and run the whole suite: lint, types, tests.
# Works on a fresh machine with only Python 3.11+. CI runs exactly this (see .ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
# torch: the CPU build, asked for by exact version (this machine kind serves 2.13.0 as a local CPU
# wheel); an open `torch` requirement would pull a multi-GB CUDA build. The package itself accepts
# any torch >= 2.1 (extra `train`).
.venv/bin/python -m pip install -q torch==2.13.0 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -m pip install -q -e '.[test,train,ray]' 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import gpucluster, fastapi, sqlalchemy, alembic, psycopg, schemathesis, pytest, pytest_timeout, xdist, torch, sklearn, ray.cluster_utils" # fail fast if an install did not take
# The dashboard's browser tests drive Debian's chromium through its chromedriver (no browser
# download: only package registries are reachable). Installed here when missing, as root.
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "== installing chromium and chromium-driver (apt)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; } \
      >/dev/null || echo "apt-get could not install chromium: the dashboard browser tests will be skipped" >&2
  else
    echo "chromium/chromedriver missing and cannot apt-get them: the dashboard browser tests will be skipped" >&2
  fi
fi
# The store's tests run on SQLite and on a real PostgreSQL server (tests/pgserver.py starts a
# private one from Debian's binaries). Installed here when missing, as root; the package's own
# cluster is not started (the tests run initdb into a temp dir).
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "== installing postgresql (apt)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql; } \
      >/dev/null || echo "apt-get could not install postgresql: the PostgreSQL tests will be skipped" >&2
  else
    echo "postgresql missing and cannot apt-get it: the PostgreSQL tests will be skipped" >&2
  fi
fi
# Container jobs (tests/e2e/test_containers.py) run real Podman with runc (the cgroupfs manager: the
# test's own containers.conf), on an image the tests build from a static busybox; uidmap gives
# rootless podman its subordinate ids, catatonit is podman's --init; docker-registry is a real
# registry the pull-progress test starts privately (its own config and port; the package's system
# service is never started). Installed here when missing, as root; nothing of the machine's podman
# config is changed (the tests use a private one).
if ! command -v podman >/dev/null || ! command -v runc >/dev/null || ! command -v busybox >/dev/null \
    || ! command -v newuidmap >/dev/null || ! command -v docker-registry >/dev/null \
    || ! { command -v catatonit >/dev/null || [ -x /usr/libexec/podman/catatonit ]; }; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "== installing podman, runc, uidmap, catatonit, busybox-static and docker-registry (apt)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        podman runc uidmap catatonit busybox-static docker-registry; } \
      >/dev/null || echo "apt-get could not install podman: the container tests will be skipped" >&2
  else
    echo "podman/runc/busybox missing and cannot apt-get them: the container tests will be skipped" >&2
  fi
fi
echo "== ruff"; .venv/bin/ruff check src tests bench && .venv/bin/ruff format --check -q src tests bench
echo "== mypy"; .venv/bin/mypy
echo "== pytest"
set +e
# One process by default. GPUCLUSTER_TEST_WORKERS=2 splits the run over two pytest-xdist workers:
# the tests with real heads, clusters and browsers in order on one (tests/conftest.py's
# serial_scope), the pure ones on the other. Not the default: on this 2-core machine it took 22 min
# against one process's 25, and beside the pure tests a gloo rank aborted at its requeue exit
# (README "Tests"). The 30 slowest tests are listed after the run (--durations), so a slow CI run
# says where its time went.
.venv/bin/pytest -q -n "${GPUCLUSTER_TEST_WORKERS:-0}" --durations=30 "$@"
rc=$?
set -e
[ "$rc" -eq 5 ] && { echo "no tests ran" >&2; exit 1; }
exit "$rc"
