#!/usr/bin/env bash
# openssh-server for testbed's servers (docs/servers.md), installed WITHOUT a host sshd: the package is installed so
# that the lab VM (which runs this machine's root filesystem) and other servers can start their own sshd, for one
# run, on a project address; this machine must not start listening on port 22 because of it. Called by install.sh;
# idempotent (nothing happens when the package is already there). Root (install.sh re-runs itself under sudo).
#
# How the host daemon is kept off: Debian's maintainer scripts start services through invoke-rc.d, which asks
# /usr/sbin/policy-rc.d first; exit status 101 means "not allowed". When no policy file exists we write one for the
# duration of the install and remove it after (a policy file already there, e.g. a container's, is left alone and
# obeyed). Where systemd runs, the units are then disabled so that a reboot does not start them either, but only
# when this script installed the package (an sshd the machine had before is the administrator's).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/as-root.sh" && as_root "${BASH_SOURCE[0]}" "$@"
say() { printf 'install: %s\n' "$*"; }

if dpkg-query -W -f='${Status}' openssh-server 2>/dev/null | grep -q "install ok installed"; then
  say "openssh-server: present (its service is left as the administrator set it)"
  exit 0
fi
policy=/usr/sbin/policy-rc.d
ours=0
cleanup() { [ "$ours" = 1 ] && rm -f "$policy"; return 0; }
# bash runs an EXIT trap on exit only: a SIGTERM or Ctrl-C must exit first, or the policy (no service may start)
# would stay on the machine for every later package install. Traps are set before the file is written.
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 129' HUP
trap 'exit 130' INT
if [ ! -e "$policy" ]; then
  ours=1
  printf '#!/bin/sh\n# written by testbed scripts/install-sshd.sh for one install: start no service\nexit 101\n' \
    > "$policy"
  chmod 755 "$policy"
fi
say "apt-get install openssh-server (no host sshd is started)"
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -qq --no-install-recommends openssh-server >/dev/null 2>&1 || {
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends openssh-server >/dev/null
}
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
  systemctl disable --now ssh.service ssh.socket >/dev/null 2>&1 || true
fi
# what the policy was for: no sshd of this install listening (a listener on port 22 that is not an sshd is not ours)
listeners=$(ss -ltnpH 2>/dev/null || true)
if [[ "$listeners" == *'"sshd"'* ]]; then
  say "warning: an sshd listens on this machine after the install; testbed starts its own per run and needs none"
else
  say "openssh-server installed; no sshd listens"
fi
