#!/usr/bin/env bash
# The flagship demo, from a fresh machine: install what is needed, show what this kernel can do, then run the
# demo scenario on the real kernel (in the lab VM when this kernel lacks what it needs) and print its table.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/as-root.sh" && as_root "${BASH_SOURCE[0]}" "$@"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/install.sh
echo; echo "== what this kernel can do (testbed doctor)"
.venv/bin/testbed doctor || echo "(some capabilities are missing here: the scenario runs in the lab VM)"
echo; echo "== demo run"
if [ -n "${TESTBED_DEMO:-}" ]; then
  exec .venv/bin/testbed run "$TESTBED_DEMO" "$@"
fi
# The flagship: synchronized incast on a 2-spine leaf-spine. 6 senders each send 64 KB to one receiver at the same
# instant, 10 rounds, through a 32 KB drop-tail buffer on the receiver's leaf port: drops, retransmissions and a
# round-time tail (p99) many times the median, although every link has bandwidth to spare on average.
exec .venv/bin/testbed run incast --set senders=6 --set hosts_per_leaf=3 --set block_bytes=64000 --set rounds=10 \
  --set buffer_bytes=32000 --set host_rate_mbps=20 --set fabric_rate_mbps=40 "$@"
