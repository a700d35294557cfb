#!/usr/bin/env bash
# Create the project's virtualenv with a Python >= 3.11 and install gpupool into it.
# usage: bootstrap-venv.sh VENV_DIR [run|test]
#   run   what `make run` needs: gpupool and ansible-core (the playbook runs from it),
#         and nginx-light with njs (libnginx-mod-http-js) for the sessions' proxy
#   test  run's, plus the test tools `make test` needs: the dev extras, the
#         customers' client, and Debian's chromium with its driver
# Every install step stops the script on failure with the tool's own output and
# a sentence on what to check; nothing fails later as a missing module.
set -euo pipefail
venv=${1:-.venv}
profile=${2:-run}
case $profile in run|test) ;; *) echo "usage: $0 VENV_DIR [run|test]" >&2; exit 2 ;; esac
sudo=$([ "$(id -u)" -eq 0 ] || echo sudo)
log=$(mktemp)
trap 'rm -f "$log"' EXIT

fail() { echo "bootstrap-venv: $*" >&2; exit 1; }

# step WHAT HINT COMMAND...: runs COMMAND quietly; on failure prints its output
# and what to check, and stops.
step() {
  local what=$1 hint=$2; shift 2
  echo "bootstrap-venv: $what"
  if ! "$@" >"$log" 2>&1; then
    grep -v '^WARNING: Location' "$log" | tail -n 40 >&2
    fail "$what failed (the output above is the tool's own). $hint"
  fi
}

readonly APT_HINT="Check that this machine reaches the package archives in /etc/apt/sources.list and /etc/apt/sources.list.d (apt-get update must work), and that no other apt or dpkg is running."
readonly PIP_HINT="Check that this machine reaches the Python package index (pip config list; PIP_INDEX_URL), and that its certificates verify (ca-certificates installed, PIP_CERT)."
apt_updated=false
apt_install() {
  command -v apt-get >/dev/null || fail "cannot install $* without apt-get: install them, then run this again"
  if ! $apt_updated; then
    step "apt-get update" "$APT_HINT" $sudo apt-get update -q
    apt_updated=true
  fi
  step "apt-get install $*" "$APT_HINT" $sudo env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -q --no-install-recommends "$@"
}

# The system's interpreter first: the service user and the tenants must be able to
# run the virtualenv's Python, and one under a private home (pyenv in /root) they cannot.
find_python() {
  for candidate in /usr/bin/python3.13 /usr/bin/python3.12 /usr/bin/python3.11 /usr/bin/python3 \
                   python3.13 python3.12 python3.11 python3; do
    if command -v "$candidate" >/dev/null &&
       "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      command -v "$candidate"; return 0
    fi
  done
  return 1
}

# The playbook's modules run under /usr/bin/python3 (the local inventory): a
# minimal image has no Python at all. Ubuntu 22.04's python3 is 3.10; its archive
# has 3.11 for the virtualenv.
[ -x /usr/bin/python3 ] || apt_install python3
python=$(find_python || true)
if [ -z "$python" ]; then
  apt_install python3.11 python3.11-venv
  python=$(find_python || true)
fi
[ -n "$python" ] || fail "need Python 3.11 or newer (found: $(/usr/bin/python3 --version 2>&1 || echo none)); install python3.11 and python3.11-venv"

if ! "$python" -m venv --help >/dev/null 2>&1 || ! "$python" -c 'import ensurepip' 2>/dev/null; then
  minor=$("$python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
  apt_install "python$minor-venv"
fi
if [ -x "$venv/bin/python" ] && [ "$(readlink -f "$venv/bin/python")" != "$(readlink -f "$python")" ]; then
  rm -rf "$venv"   # made with another interpreter (say, root's pyenv): start again
fi
if [ ! -x "$venv/bin/pip" ]; then
  rm -rf "$venv"   # a half-made one from an interrupted run
  step "creating the virtualenv $venv with $python" "Check that $(dirname "$(readlink -f "$venv/..")") is writable and has free space." \
    "$python" -m venv "$venv"
fi

pip_install() {
  step "pip install $*" "$PIP_HINT" "$venv/bin/pip" install -q --disable-pip-version-check "$@"
}
# The sessions' reverse proxy: make run starts it on a loopback port, and the session
# tests (tests/live/test_sessions.py) start their own; neither touches the system's nginx.
[ -x /usr/sbin/nginx ] || apt_install nginx-light
# njs: the proxy's filter of the apps' cookies (deploy/ansible/roles/gpupool_proxy/files/gpupool-sessions.js).
[ -e /usr/lib/nginx/modules/ngx_http_js_module.so ] || apt_install libnginx-mod-http-js
# `deploy`: ansible-core, which `make cluster` runs the playbook with.
pip_install -e '.[deploy]'
"$venv/bin/python" -c 'import gpupool, api, flask, sqlalchemy, ansible' ||
  fail "$venv lacks gpupool's modules although pip succeeded: remove $venv and run this again"

if [ "$profile" = test ]; then
  # The web pages' browser tests run headless Chromium with its matching driver.
  command -v chromedriver >/dev/null || apt_install chromium chromium-driver
  pip_install -e '.[deploy,dev,docs,lint]'
  # The customers' client (its own distribution) is tested against the real server.
  pip_install -e ./client
  "$venv/bin/python" -c 'import pytest, selenium, gpupool_client, mkdocs, material' ||
    fail "$venv lacks the test tools although pip succeeded: remove $venv and run this again"
fi
