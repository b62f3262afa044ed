#!/usr/bin/env bash
# Install everything testbed needs on a Debian 12/13 or Ubuntu 24.04+ machine, as root. Idempotent.
#
#   scripts/install.sh               Debian packages, the lab-VM kernel, the virtualenv (.venv) with testbed in it
#   scripts/install.sh --box-kernel  also make that kernel this machine's own boot kernel (dedicated lab VMs
#                                    such as the Vagrant box only; needs a reboot afterwards)
#
# The host's own network configuration is never touched. The lab-VM kernel is fetched from Debian's
# trixie-backports with a private apt state (the host's sources and package lists are not changed) and
# unpacked under /lib/modules/<release>/, where the microVM (which shares the host filesystem) finds it.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/as-root.sh" && as_root "${BASH_SOURCE[0]}" "$@"

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
say() { printf 'install: %s\n' "$*"; }
die() { printf 'install: %s\n' "$*" >&2; exit 2; }

box_kernel=0
for arg in "$@"; do
  case "$arg" in
    --box-kernel) box_kernel=1 ;;
    *) die "unknown option $arg (usage: scripts/install.sh [--box-kernel])" ;;
  esac
done
[ -r /etc/os-release ] || die "unsupported system: no /etc/os-release (need Debian 12/13 or Ubuntu 24.04+)"
. /etc/os-release
case "${ID}:${VERSION_ID:-}" in
  debian:12|debian:13|debian:14) ;;
  ubuntu:24.*|ubuntu:25.*|ubuntu:26.*) ;;
  *) die "unsupported system: ${PRETTY_NAME:-$ID} (need Debian 12/13 or Ubuntu 24.04+)" ;;
esac
[ "$(uname -m)" = x86_64 ] || die "unsupported architecture $(uname -m): the lab-VM kernel is amd64"

export DEBIAN_FRONTEND=noninteractive
packages=(
  mininet openvswitch-switch openvswitch-common
  rdma-core ibverbs-utils ibverbs-providers rdmacm-utils perftest python3-pyverbs
  iproute2 iputils-ping ethtool tcpdump iperf3 procps psmisc kmod e2fsprogs
  qemu-system-x86 busybox-static
  clang libbpf-dev
  python3-torch python3-mpi4py openmpi-bin
  python3 python3-venv python3-pip
  ruby chromium curl ca-certificates xz-utils
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "apt-get install ${missing[*]}"
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  say "Debian packages: all present"
fi
# openvswitch-switch's postinst may try to start a service; the testbed starts OVS itself when it needs it.
# openssh-server for servers over ssh (docs/servers.md): installed with no host sshd started or enabled.
bash "$here/scripts/install-sshd.sh"

# ---- the lab-VM kernel ------------------------------------------------------------------------------------
# A Debian kernel whose SoftRoCE works across network namespaces (7.x; 6.1/6.12 do not) from trixie-backports.
state=/var/cache/testbed/apt
mkdir -p "$state/lists/partial" "$state/archives/partial" "$state/debs"
echo "deb http://deb.debian.org/debian trixie-backports main" > "$state/sources.list"
aptopt=(-o Dir::Etc::SourceList="$state/sources.list" -o Dir::Etc::SourceParts=/dev/null
        -o Dir::State::Lists="$state/lists" -o Dir::Cache="$state" -o Debug::NoLocking=1
        -o APT::Architecture=amd64 -o Dir::State::Status="$state/status")
touch "$state/status"
release_file=/var/cache/testbed/vm-kernel-release
have_kernel() {
  [ -f "$release_file" ] || return 1
  local r; r=$(cat "$release_file")
  [ -f "/lib/modules/$r/vmlinuz" ] && [ -f "/lib/modules/$r/modules.dep" ]
}
if have_kernel && [ -z "${TESTBED_REFRESH_KERNEL:-}" ]; then
  say "lab-VM kernel: $(cat "$release_file") (cached)"
else
  say "fetching the lab-VM kernel from trixie-backports"
  apt-get "${aptopt[@]}" update -qq
  # linux-image-amd64 (the meta package) names the current image; mirrors drop superseded builds.
  image=$(apt-cache "${aptopt[@]}" depends linux-image-amd64 2>/dev/null \
          | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
  [ -n "$image" ] || die "could not resolve linux-image-amd64 in trixie-backports"
  release=${image#linux-image-}
  release=${release%-unsigned}
  say "lab-VM kernel release: $release ($image)"
  cd "$state/debs"
  rm -f ./*.deb
  # The image package may itself be split (linux-binary-*, linux-modules-*): download it and what it depends on
  # within the linux-* family of the same release.
  want=("$image")
  for dep in $(apt-cache "${aptopt[@]}" depends "$image" 2>/dev/null | awk '/Depends: linux-/{print $2}'); do
    case "$dep" in *"$release"*) want+=("$dep");; esac
  done
  apt-get "${aptopt[@]}" download "${want[@]}" >/dev/null
  tmp=$(mktemp -d)
  for d in ./*.deb; do dpkg-deb -x "$d" "$tmp"; done
  src=""
  for cand in "$tmp/usr/lib/modules/$release" "$tmp/lib/modules/$release"; do
    [ -d "$cand" ] && src=$cand
  done
  [ -n "$src" ] || die "kernel packages had no modules/$release folder"
  if [ ! -f "$src/vmlinuz" ]; then
    [ -f "$tmp/boot/vmlinuz-$release" ] && cp "$tmp/boot/vmlinuz-$release" "$src/vmlinuz"
  fi
  [ -f "$src/vmlinuz" ] || die "kernel packages had no vmlinuz for $release"
  mkdir -p /lib/modules
  rm -rf "/lib/modules/$release"
  cp -a "$src" "/lib/modules/$release"
  [ -f "$tmp/boot/config-$release" ] && cp "$tmp/boot/config-$release" "/lib/modules/$release/config"
  rm -rf "$tmp"
  depmod "$release"
  echo "$release" > "$release_file"
  cd "$here"
fi

if [ "$box_kernel" = 1 ]; then
  # A dedicated lab machine boots the lab kernel itself: SoftRoCE across namespaces then works natively.
  release=$(cat "$release_file")
  if [ "$(uname -r)" != "$release" ]; then
    say "installing linux-image-$release from trixie-backports as this machine's kernel (reboot to use it)"
    echo "deb http://deb.debian.org/debian trixie-backports main" > /etc/apt/sources.list.d/testbed-backports.list
    apt-get update -qq
    apt-get install -y -qq -t trixie-backports "linux-image-$release" >/dev/null
  fi
fi

# ---- the virtualenv -----------------------------------------------------------------------------------------
# From Debian's python3 with system site packages, so that Debian's mininet and pyverbs import.
venv="$here/.venv"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import mininet, pyverbs' 2>/dev/null; then
  rm -rf "$venv"
  /usr/bin/python3 -m venv --system-site-packages "$venv"
fi
"$venv/bin/pip" install -q --disable-pip-version-check -e "$here[dev]"
rm -f /usr/local/bin/testbed
sed "s|@VENV@|$venv|" "$here/scripts/testbed-launcher.sh" > /usr/local/bin/testbed
chmod 755 /usr/local/bin/testbed
version=$("$venv/bin/testbed" --version) || die "testbed does not start from $venv"
say "testbed $version installed in $venv (launched by /usr/local/bin/testbed)"
