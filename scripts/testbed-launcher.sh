#!/bin/sh
# The `testbed` command on PATH (/usr/local/bin/testbed), written by scripts/install.sh: it runs the virtualenv's
# testbed. A user who cannot reach the virtualenv (a checkout in a 0700 folder such as /root/...) gets the same
# one-line refusal testbed itself gives a non-root user, not "Permission denied".
venv='@VENV@'
if [ ! -x "$venv/bin/testbed" ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "testbed: needs root (run it with sudo): this user cannot reach the installation in $venv" >&2
  else
    echo "testbed: no installation in $venv (run scripts/install.sh from the checkout)" >&2
  fi
  exit 2
fi
exec "$venv/bin/testbed" "$@"
