#!/usr/bin/env bash
# `make test-slow`: `make test` as a slow machine runs it. A burner process keeps one core busy
# (BURN_CORES of them) for the whole run, set-up included, and is stopped however the run
# ends. The suite's budgets are not scaled for it: a run that passes here passes with about
# half of the CPU this machine has when quiet.
set -euo pipefail
cd "$(dirname "$0")/.."

burners=()
stop_burners() {
    if ((${#burners[@]})); then
        kill "${burners[@]}" 2>/dev/null || true
        wait "${burners[@]}" 2>/dev/null || true
    fi
}
trap stop_burners EXIT

for _ in $(seq "${BURN_CORES:-1}"); do
    python3 -c 'while True: pass' &
    burners+=("$!")
done
echo "==> test-slow: ${#burners[@]} core(s) kept busy (pids ${burners[*]})"

started=$(date +%s)
status=0
make test || status=$?
elapsed=$(($(date +%s) - started))
printf '==> test-slow: make test %s in %dm%02ds with %d core(s) kept busy\n' \
    "$([[ $status == 0 ]] && echo passed || echo "failed ($status)")" \
    $((elapsed / 60)) $((elapsed % 60)) "${#burners[@]}"
exit "$status"
