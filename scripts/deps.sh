#!/usr/bin/env bash
# Makes sure the Debian packages of one or more of rope's commands are
# installed: the lines of scripts/packages, named after CMake presets.
#   scripts/deps.sh PRESET...        e.g. scripts/deps.sh test
# As root it installs whatever is missing with apt-get; otherwise it names
# the missing packages and the command that installs them, and fails.
set -euo pipefail
list="$(dirname "$0")/packages"

wanted=()
for name in "$@"; do
  line=$(sed -n "s/^${name}:[[:space:]]*//p" "$list")
  if [ -z "$line" ]; then
    echo "scripts/deps.sh: no line '$name:' in $list (lines: $(sed -n 's/^\([A-Za-z0-9_-]*\):.*/\1/p' "$list" | tr '\n' ' '))" >&2
    exit 2
  fi
  read -r -a pkgs <<<"$line"
  wanted+=("${pkgs[@]}")
done

missing=()
for pkg in "${wanted[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    [[ " ${missing[*]} " == *" $pkg "* ]] || missing+=("$pkg")
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
