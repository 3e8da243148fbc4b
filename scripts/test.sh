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
# Two runs, one after the other (tests/conftest.py's `--part`): first the pure tests (unit and
# simulator tests that start nothing machine-wide) on two pytest-xdist workers, then, alone, the
# tests with real heads, clusters, browsers, Unix accounts, Ray and training runs, in order in one
# process. Why not all at once: those share machine-wide things (Unix accounts, Ray's addresses,
# podman's storage, the cores a crash harness's timings assume), and beside the pure tests a gloo
# rank once aborted; the pure tests share nothing, and on two cores they take half the time.
# GPUCLUSTER_TEST_WORKERS: the pure run's workers (0: in this process). The 30 slowest tests of
# each run are listed after it (--durations), so a slow CI run says where its time went.
.venv/bin/pytest -q -n "${GPUCLUSTER_TEST_WORKERS:-2}" --part pure --durations=30 "$@"
pure=$?
.venv/bin/pytest -q -n 0 --part serial --durations=30 "$@"
serial=$?
set -e
# 5: nothing collected in that part (arguments naming tests of the other part only).
[ "$pure" -eq 5 ] && [ "$serial" -eq 5 ] && { echo "no tests ran" >&2; exit 1; }
for rc in "$pure" "$serial"; do
  [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ] && exit "$rc"
done
exit 0
