#!/usr/bin/env bash
# Installs the Debian packages the build and tests need (skips apt when they are all present).
set -euo pipefail
pkgs=(cmake ninja-build g++ clang lld pkg-config libgtest-dev nlohmann-json3-dev libcli11-dev libfmt-dev libpcre2-dev libcpp-httplib-dev libboost-dev
      python3-dev pybind11-dev python3-numpy python3-pytest python3-setuptools libopenmpi-dev openmpi-bin python3-jsonschema)
missing=()
for p in "${pkgs[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}"
fi
