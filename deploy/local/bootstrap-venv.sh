#!/usr/bin/env bash
# Create the project's virtualenv with a Python >= 3.11 and install gpupool into it.
# usage: bootstrap-venv.sh VENV_DIR
set -euo pipefail
venv=${1:-.venv}
sudo=$([ "$(id -u)" -eq 0 ] || echo sudo)

find_python() {
  for candidate in python3.13 python3.12 python3.11 python3; do
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
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check -e '.[dev]' 2>&1 | grep -v '^WARNING: Location' || true
"$venv/bin/python" -c 'import gpupool, api, flask, sqlalchemy' # fail here, not mid-test, if the install broke
