#!/usr/bin/env bash
# Installs what Red Lite needs to build and test on Debian 12 / Ubuntu 24.04 (run as root or with sudo).
set -euo pipefail
pkgs=(cmake ninja-build g++ pkg-config
      libfmt-dev nlohmann-json3-dev libcli11-dev libpcre2-dev
      libboost-dev libcpp-httplib-dev libbrotli-dev libssl-dev zlib1g-dev
      googletest libgtest-dev libgmock-dev libbenchmark-dev
      tmux nodejs npm
      python3 python3-jinja2 python3-jsonschema)  # the reference renderer and validator of the tests
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# node/npm may come from elsewhere than Debian's packages; only ask apt when they are absent.
if command -v node >/dev/null && command -v npm >/dev/null; then
  missing=("${missing[@]/nodejs}"); missing=("${missing[@]/npm}")
fi
read -r -a missing <<<"${missing[*]}"
if ((${#missing[@]})); then
  SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
echo "dependencies present"
