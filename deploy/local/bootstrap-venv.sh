#!/usr/bin/env bash
# Create the project's virtualenv with a Python >= 3.11 and install gpupool into it.
# usage: bootstrap-venv.sh VENV_DIR
set -euo pipefail
venv=${1:-.venv}
sudo=$([ "$(id -u)" -eq 0 ] || echo sudo)

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

python=$(find_python || true)
if [ -z "$python" ] && command -v apt-get >/dev/null; then
  # Ubuntu 22.04's python3 is 3.10; its archive has 3.11.
  $sudo apt-get update -qq && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3.11 python3.11-venv >/dev/null
  python=$(find_python)
fi
[ -n "$python" ] || { echo "bootstrap-venv: need Python 3.11 or newer" >&2; exit 1; }

if ! "$python" -m venv --help >/dev/null 2>&1 || ! "$python" -c 'import ensurepip' 2>/dev/null; then
  minor=$("$python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
  $sudo apt-get update -qq && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "python$minor-venv" >/dev/null
fi
if [ -x "$venv/bin/python" ] && [ "$(readlink -f "$venv/bin/python")" != "$(readlink -f "$python")" ]; then
  rm -rf "$venv"   # made with another interpreter (say, root's pyenv): start again
fi
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
# The web pages' browser tests run headless Chromium with its matching driver.
if ! command -v chromedriver >/dev/null && command -v apt-get >/dev/null; then
  $sudo apt-get update -qq && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
fi
"$venv/bin/pip" install -q --disable-pip-version-check -e '.[dev]' 2>&1 | grep -v '^WARNING: Location' || true
# The customers' client (its own distribution) is tested against the real server.
"$venv/bin/pip" install -q --disable-pip-version-check -e ./client 2>&1 | grep -v '^WARNING: Location' || true
"$venv/bin/python" -c 'import gpupool, api, flask, sqlalchemy, gpupool_client' # fail here, not mid-test, if the install broke
