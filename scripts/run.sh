#!/usr/bin/env bash
# The main job: the eventsrc daemon under a local root directory (./run/root, or $ROOT_DIR).
# It starts the daemon, shows that it is ready and what its log holds, then keeps it in
# the foreground until Ctrl-C (or for $RUN_SECONDS seconds), and shows the log again.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT_DIR=${ROOT_DIR:-$PWD/run/root}
mkdir -p "$(dirname "$ROOT_DIR")"
E=(.venv/bin/eventsrc --root-dir "$ROOT_DIR")

echo "== eventsrc serve --root-dir $ROOT_DIR"
"${E[@]}" serve &
pid=$!
trap 'kill -TERM $pid 2>/dev/null || true' INT TERM
for _ in $(seq 1 100); do
  if "${E[@]}" status >/dev/null 2>&1; then break; fi
  if ! kill -0 $pid 2>/dev/null; then wait $pid; exit $?; fi
  sleep 0.1
done
echo "== eventsrc status"
"${E[@]}" status
echo "== eventsrc log   (every start and stop of this root, oldest first)"
"${E[@]}" log
if [[ -n "${RUN_SECONDS:-}" ]]; then
  sleep "$RUN_SECONDS"
  kill -TERM $pid
else
  echo "== the daemon runs until Ctrl-C; from another shell try: ${E[*]} state"
fi
wait $pid || true
echo "== eventsrc log | tail -n 2   (it recorded that it stopped)"
"${E[@]}" log | tail -n 2
