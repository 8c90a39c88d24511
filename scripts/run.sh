#!/usr/bin/env bash
# The main job: the eventsrc daemon under a local root directory (./run/root, or $ROOT_DIR),
# with the sample device plugin (8 devices on 2 NUMA nodes) and a few pods from examples/:
# two admitted, one refused with its reason, one removed. Then the daemon keeps running
# until Ctrl-C (or for $RUN_SECONDS seconds), and stops cleanly.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT_DIR=${ROOT_DIR:-$PWD/run/root}
mkdir -p "$(dirname "$ROOT_DIR")"
E=(.venv/bin/eventsrc --root-dir "$ROOT_DIR")
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "eventsrc serve --root-dir $ROOT_DIR   (logs in run/daemon.log)"
"${E[@]}" serve >"$(dirname "$ROOT_DIR")/daemon.log" 2>&1 &
daemon=$!
plugin=""
trap 'kill -TERM $plugin $daemon 2>/dev/null || true' INT TERM EXIT
for _ in $(seq 1 100); do
  if "${E[@]}" status >/dev/null 2>&1; then break; fi
  sleep 0.1
done
"${E[@]}" status
say "eventsrc sample-plugin --devices 8 --numa-nodes 2 --preferred   (logs in run/plugin.log)"
"${E[@]}" sample-plugin --devices 8 --numa-nodes 2 --preferred >"$(dirname "$ROOT_DIR")/plugin.log" 2>&1 &
plugin=$!
for _ in $(seq 1 100); do
  if grep -q "sample-plugin: registered" "$(dirname "$ROOT_DIR")/plugin.log" 2>/dev/null; then break; fi
  sleep 0.1
done
grep "sample-plugin: registered" "$(dirname "$ROOT_DIR")/plugin.log"

say "eventsrc admit -f examples/web.yaml      (2 devices)"
"${E[@]}" admit -f examples/web.yaml || true
say "eventsrc admit -f examples/train.yaml    (an init container with 1, reused by a trainer with 4)"
"${E[@]}" admit -f examples/train.yaml || true
say "eventsrc admit -f examples/greedy.yaml   (4 more: refused, only 2 are free)"
"${E[@]}" admit -f examples/greedy.yaml || echo "(refused, as expected)"
say "eventsrc remove default/web"
"${E[@]}" remove default/web >/dev/null && echo "removed default/web: its 2 devices are free again"
say "eventsrc pods"
"${E[@]}" pods
say "eventsrc log   (the last 12 records: every decision, with its correlation id)"
"${E[@]}" log | tail -n 12 | cut -c1-160

if [[ -n "${RUN_SECONDS:-}" ]]; then
  sleep "$RUN_SECONDS"
else
  say "the daemon runs until Ctrl-C; from another shell try: ${E[*]} state"
  wait $daemon || true
fi
kill -TERM $plugin $daemon 2>/dev/null || true
wait $daemon 2>/dev/null || true
trap - INT TERM EXIT
say "stopped: eventsrc log | tail -n 1"
"${E[@]}" log | tail -n 1 | cut -c1-160
