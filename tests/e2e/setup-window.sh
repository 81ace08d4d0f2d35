#!/usr/bin/env bash
# Installs (once) what the windowed sandbox needs on Debian or Ubuntu: the -dev packages Bevy's default features
# build against (Wayland, udev, ALSA, xkbcommon), the X libraries winit loads at run time, and for its test an X
# server (Xvfb) and software Vulkan (Mesa's lavapipe). Uses apt-get as root, or through sudo; does nothing when
# everything is there. Never asks: no standard input in CI (a changed configuration file keeps the local one).
set -euo pipefail
packages=(pkg-config libwayland-dev libudev-dev libasound2-dev libxkbcommon-dev xvfb mesa-vulkan-drivers libvulkan1
  libxkbcommon-x11-0 libxcursor1 libxrandr2 libxi6 libx11-xcb1)
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
[ ${#missing[@]} -eq 0 ] && exit 0
as_root=()
[ "$(id -u)" -eq 0 ] || as_root=(sudo -n)
export DEBIAN_FRONTEND=noninteractive
quiet=(-o Acquire::Retries=3 -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold)
"${as_root[@]}" apt-get "${quiet[@]}" update -q >&2
"${as_root[@]}" apt-get "${quiet[@]}" install -y -q --no-install-recommends "${missing[@]}" >&2
