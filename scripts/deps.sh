#!/usr/bin/env bash
# Makes sure the Debian packages rope needs are installed.
#   scripts/deps.sh PACKAGE...
# As root it installs whatever is missing with apt-get; otherwise it names
# the missing packages and the command that installs them, and fails.
set -euo pipefail

missing=()
for pkg in "$@"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
  echo "rope needs these Debian packages, which are not installed: ${missing[*]}" >&2
  echo "install them with:  sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "installing Debian packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
