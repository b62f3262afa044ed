# Sourced by the scripts in this folder: they need root (packages, namespaces, qdiscs). Run by a user, the script
# re-executes itself under sudo (keeping the TESTBED_* settings and CI); in a root shell nothing happens, so the
# same command works with and without sudo installed.
as_root() {  # as_root SCRIPT_PATH ARGS...
  [ "$(id -u)" = 0 ] && return 0
  local self; self=$(readlink -f "$1"); shift
  if ! command -v sudo >/dev/null 2>&1; then
    printf '%s: needs root, and this machine has no sudo: run it from a root shell\n' "$(basename "$self")" >&2
    exit 2
  fi
  local keep=() kv
  while IFS= read -r -d '' kv; do
    case "$kv" in TESTBED_*=*|CI=*) keep+=("$kv") ;; esac
  done < <(env -0)
  exec sudo -- env "${keep[@]}" bash "$self" "$@"
}
