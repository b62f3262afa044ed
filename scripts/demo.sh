#!/usr/bin/env bash
# The flagship demo, from a fresh machine: install what is needed, show what this kernel can do, then run the
# demo scenario on the real kernel (in the lab VM when this kernel lacks what it needs) and print its table.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/install.sh
echo; echo "== what this kernel can do (testbed doctor)"
.venv/bin/testbed doctor || echo "(some capabilities are missing here: the scenario runs in the lab VM)"
echo; echo "== demo run"
scenario=${TESTBED_DEMO:-smoke}
exec .venv/bin/testbed run "$scenario" "$@"
