#!/usr/bin/env bash
# The demo behind `make run`: a node's story in a few seconds, on a fresh log under
# ./run/root (or $ROOT_DIR, which must not hold a log yet). The daemon, the sample device
# plugin (9 devices on 2 NUMA nodes) and the sample DRA driver start on a simulated 2-NUMA
# machine; pods are admitted (one with its CPUs, device and memory on one NUMA node),
# one is refused with the kubelet's reason, one is removed and its devices go to another;
# the daemon is killed with SIGKILL and started again, and every pod still has what it
# had. It ends with the audit trail of a device that moved and a replay of what just
# happened, then stops everything cleanly (exit 0).
#   KEEP_RUNNING=1   leave the daemon, plugin and driver running at the end until Ctrl-C
#   RUN_SECONDS=N    ... or for N seconds
#   EVENTSRC=PATH    the eventsrc to run (default .venv/bin/eventsrc, which `make run` installs)
set -euo pipefail
if [[ -n "${ROOT_DIR:-}" ]]; then ROOT_DIR=$(realpath -m "$ROOT_DIR"); fi  # before the cd below
cd "$(dirname "$0")/.."
if [[ -n "${ROOT_DIR:-}" ]]; then
  if [[ -e "$ROOT_DIR/eventsrc/log" ]]; then
    echo "run.sh: $ROOT_DIR already holds an event log; the demo needs a new directory" >&2
    exit 1
  fi
else
  ROOT_DIR=$PWD/run/root
  fresh=1  # the demo's own directory: emptied for a fresh story each run
fi
RUN=$(dirname "$ROOT_DIR")
E=("${EVENTSRC:-.venv/bin/eventsrc}" --root-dir "$ROOT_DIR")
if "${E[@]}" status >/dev/null 2>&1; then
  echo "run.sh: an eventsrc daemon from an earlier run is still running on $ROOT_DIR; stop it first" >&2
  exit 1
fi
if [[ -n "${fresh:-}" ]]; then rm -rf "$ROOT_DIR"; fi
rm -f "$RUN"/{daemon,plugin,dra-driver}.log
mkdir -p "$RUN"
if [[ -t 1 ]]; then B=$'\033[1m' N=$'\033[0m'; else B="" N=""; fi
say() { printf '\n%s== %s%s\n' "$B" "$*" "$N"; }
# Admission output without the per-device details (envs, mounts, device nodes, annotations, CDI).
brief() { grep -v -E '^ +(envs|mount|device|annotations|cdi):' || true; }
last_seq() { "${E[@]}" status -o json | sed -n 's/.*"last_seq": *\([0-9]*\).*/\1/p'; }

daemon="" plugin="" driver=""
stop_all() {  # the daemon first, so that its DaemonStopped is the last record
  trap - INT TERM EXIT
  if [[ -n "$daemon" ]]; then kill -TERM "$daemon" 2>/dev/null || true; wait "$daemon" 2>/dev/null || true; fi
  kill -TERM $plugin $driver 2>/dev/null || true
  wait 2>/dev/null || true
}
trap 'stop_all; exit 130' INT TERM
trap stop_all EXIT

# A simulated machine (examples/topology-2numa.json: 8 CPUs and 4Gi on each of 2 NUMA nodes)
# with the kubelet's CPU, memory and topology managers on.
SERVE=(--topology-file examples/topology-2numa.json --cpu-manager-policy static --reserved-cpu-count 1
  --topology-manager-policy best-effort --memory-manager-policy Static --reserved-memory 0:memory=100Mi)
start_daemon() {
  "${E[@]}" serve "${SERVE[@]}" >>"$RUN/daemon.log" 2>&1 &
  daemon=$!
  for _ in $(seq 1 300); do
    if "${E[@]}" status >/dev/null 2>&1; then "${E[@]}" status; return; fi
    if ! kill -0 "$daemon" 2>/dev/null; then break; fi
    sleep 0.1
  done
  echo "run.sh: the daemon did not become ready; the end of $RUN/daemon.log:" >&2
  tail -n 20 "$RUN/daemon.log" >&2
  exit 1
}

# wait_for FILE TEXT COUNT: until TEXT appears COUNT times in FILE (a plugin's log).
wait_for() {
  for _ in $(seq 1 300); do
    if [[ $(grep -c "$2" "$1" 2>/dev/null) -ge $3 ]]; then return; fi
    sleep 0.1
  done
  echo "run.sh: no '$2' in $1 after 30 s" >&2
  exit 1
}

say "1. Start the daemon: it rebuilds its views from the event log (empty so far) and serves the kubelet's sockets"
echo "\$ eventsrc serve --root-dir $ROOT_DIR ${SERVE[*]}   (its log: $RUN/daemon.log)"
start_daemon

say "2. Start the sample device plugin and the sample DRA driver: they register as they would with a kubelet"
"${E[@]}" sample-plugin --devices 9 --numa-nodes 2 --preferred >"$RUN/plugin.log" 2>&1 &
plugin=$!
"${E[@]}" sample-dra-driver --driver gpu.example.com >"$RUN/dra-driver.log" 2>&1 &
driver=$!
wait_for "$RUN/plugin.log" "sample-plugin: registered" 1
wait_for "$RUN/dra-driver.log" "sample-dra-driver: registered" 1
grep -h -E "^sample-(plugin|dra-driver): registered" "$RUN/plugin.log" "$RUN/dra-driver.log"

say "3. Admit default/web (2 devices): what a container gets, as the plugin's Allocate answered"
echo "\$ eventsrc admit -f examples/web.yaml"
web=$("${E[@]}" admit -f examples/web.yaml 2>&1)
echo "$web"
web_devices=$(sed -n 's/^ *example.com\/dev: //p' <<<"$web" | tr -d ' ')

say "4. Admit ml/train: an init container's device is reused by the trainer, which takes 4"
echo "\$ eventsrc admit -f examples/train.yaml"
"${E[@]}" admit -f examples/train.yaml 2>&1 | brief

say "4b. Admit default/aligned (2 CPUs, a device, 1Gi; Guaranteed): the topology manager puts all three on one NUMA node"
echo "\$ eventsrc admit -f examples/aligned.yaml"
"${E[@]}" admit -f examples/aligned.yaml 2>&1 | brief

say "5. Admit default/greedy (4 devices): only 2 are free, so it is refused with the kubelet's own reason"
echo "\$ eventsrc admit -f examples/greedy.yaml"
if "${E[@]}" admit -f examples/greedy.yaml 2>&1; then
  echo "run.sh: default/greedy was admitted; it should have been refused" >&2
  exit 1
fi
echo "(refused: exit status 1, and the refusal is in the log as AdmissionRejected)"

say "6. Admit default/inference with its ResourceClaim: the DRA driver prepares the claim"
echo "\$ eventsrc admit -f examples/inference.yaml -f examples/inference-claim.yaml"
"${E[@]}" admit -f examples/inference.yaml -f examples/inference-claim.yaml 2>&1

before_move=$(last_seq)
say "7. Remove default/web, then admit default/greedy again: it fits now, on web's old devices"
echo "\$ eventsrc remove default/web"
"${E[@]}" remove default/web | head -n 1
echo "\$ eventsrc admit -f examples/greedy.yaml"
greedy=$("${E[@]}" admit -f examples/greedy.yaml 2>&1)
brief <<<"$greedy"
greedy_devices=$(sed -n 's/^ *example.com\/dev: //p' <<<"$greedy" | tr -d ' ')
moved=""
for d in ${web_devices//,/ }; do
  if [[ ",$greedy_devices," == *",$d,"* ]]; then moved=$d; break; fi
done
moved=${moved:-${web_devices%%,*}}

say "8. kill -9 the daemon: no clean stop, no snapshot; the next start finishes what it left unfinished, from the log"
echo "\$ kill -9 $daemon"
kill -9 "$daemon"
{ wait "$daemon"; } 2>/dev/null || true  # (without bash's "Killed" notice)
echo "\$ eventsrc serve --root-dir $ROOT_DIR ${SERVE[*]}"
start_daemon
wait_for "$RUN/plugin.log" "sample-plugin: registered" 2
wait_for "$RUN/dra-driver.log" "sample-dra-driver: registered" 2
echo "(the plugin and the driver registered again; running pods kept their devices in the meantime)"

say "9. The pods after the restart: every pod kept its devices, from the log alone (no checkpoint files)"
echo "\$ eventsrc pods"
"${E[@]}" pods

say "10. Who held example.com/dev $moved, and when: the audit trail, read from the log's index"
echo "\$ eventsrc audit device example.com/dev $moved"
"${E[@]}" audit device example.com/dev "$moved"

say "11. Replay what just happened, one event a line with the change it made: the move, the SIGKILL, the restart"
echo "\$ eventsrc replay --step --from $((before_move + 1))"
"${E[@]}" replay --step --from $((before_move + 1))

if [[ "${KEEP_RUNNING:-}" == 1 || -n "${RUN_SECONDS:-}" ]]; then
  if [[ -n "${RUN_SECONDS:-}" ]]; then until="for $RUN_SECONDS s"; else until="until Ctrl-C"; fi
  say "The daemon, the plugin and the driver keep running $until; from another shell try:"
  echo "  ${E[*]} state"
  echo "  ${E[*]} log --follow"
  trap : INT TERM  # Ctrl-C ends the wait, then everything stops cleanly below
  if [[ -n "${RUN_SECONDS:-}" ]]; then sleep "$RUN_SECONDS"; else wait "$daemon" || true; fi
fi
say "Stop everything with SIGTERM: the daemon records DaemonStopped and writes a snapshot"
stop_all
"${E[@]}" log | tail -n 1 | cut -c1-120
echo "Explore: ${E[*]} state   (or: log, audit pod ml/train, replay --until SEQ; see README.md)"
