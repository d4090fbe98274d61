#!/usr/bin/env bash
# Installs what kestrel needs to build, where it is missing: Meson, Ninja,
# pkg-config, Eigen, xsimd and doctest from Debian/Ubuntu packages. Without
# root/sudo or apt it prints what to install and leaves Meson's wraps
# (subprojects/) to fetch the libraries.
set -euo pipefail
pkgs=(meson ninja-build pkg-config g++ libeigen3-dev libxsimd-dev doctest-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if ! command -v apt-get >/dev/null; then
  echo "kestrel: please install: ${missing[*]} (or Meson >= 1.0 and let the wraps fetch the libraries)" >&2
  exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "kestrel: installing ${missing[*]}" >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
