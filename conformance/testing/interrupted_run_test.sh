#!/usr/bin/env bash
# fsdp-conform interrupted while Gloo ranks run (usage: interrupted_run_test.sh FSDP_CONFORM):
#  * SIGTERM: the ranks are stopped, the partial --json report is written with "interrupted",
#    and fsdp-conform ends by the signal (status 143); the case in flight says it was
#    interrupted (not that it ran past its deadline);
#  * SIGKILL: no handler runs, yet no rank outlives it (the launcher's death watch).
# Each check allows 3 s after the signal for every rank process to be gone.
set -u
conform=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

alive() {  # alive PID: the process exists and is not a zombie
  [ -r "/proc/$1/stat" ] || return 1
  local state
  state=$(sed -E 's/^[0-9]+ \(.*\) ([A-Za-z]).*/\1/' "/proc/$1/stat" 2>/dev/null) || return 1
  [ -n "$state" ] && [ "$state" != Z ]
}

# Starts a long gloo case (world 2, 20 rounds of a barrier entered 500 ms late) and waits until
# its two ranks run; sets pid (fsdp-conform) and ranks (its children: the ranks, the watch).
start_run() {  # start_run JSON_PATH
  "$conform" run collectives/barrier --backend gloo --world 2 --param rounds=20 \
    --param delay_ms=500 --json "$1" >"$work/out.txt" 2>&1 &
  pid=$!
  ranks=""
  local i
  for i in $(seq 1 200); do
    ranks=$(pgrep -P "$pid" | tr '\n' ' ')
    [ "$(echo $ranks | wc -w)" -ge 3 ] && break  # 2 ranks + the death watch
    sleep 0.05
  done
  [ "$(echo $ranks | wc -w)" -ge 3 ] || fail "the ranks did not start: $(cat "$work/out.txt")"
  sleep 0.5
}

gone_within_3s() {  # gone_within_3s PID...: every PID has ended within 3 s
  local deadline=$((SECONDS + 3)) p left
  while :; do
    left=""
    for p in "$@"; do alive "$p" && left="$left $p"; done
    [ -z "$left" ] && return 0
    [ "$SECONDS" -ge "$deadline" ] && { echo "still running:$left"; ps -o pid,ppid,stat,args -p "${left// /,}" 2>/dev/null; return 1; }
    sleep 0.05
  done
}

# ---- SIGTERM: partial report, exit by the signal, no rank left ----
start_run "$work/term.json"
kill -TERM "$pid"
wait "$pid"
status=$?
[ "$status" -eq 143 ] || fail "SIGTERM: exit status $status, expected 143 (output: $(cat "$work/out.txt"))"
gone_within_3s $ranks || fail "SIGTERM: ranks outlived fsdp-conform"
grep -q '"interrupted"' "$work/term.json" || fail "SIGTERM: the report has no \"interrupted\" entry"
grep -q '"signal": 15' "$work/term.json" || fail "SIGTERM: the report does not name signal 15"
grep -q 'interrupted by signal 15' "$work/out.txt" || fail "SIGTERM: the table does not say it was interrupted"
grep -q 'interrupted: fsdp-conform received signal 15' "$work/term.json" ||
  fail "SIGTERM: the case in flight is not reported as interrupted: $(cat "$work/term.json")"
grep -q 'did not finish within' "$work/term.json" &&
  fail "SIGTERM: the case in flight is reported as past its deadline: $(cat "$work/term.json")"

# ---- SIGKILL: nothing runs in fsdp-conform, the death watch stops the ranks ----
start_run "$work/kill.json"
kill -KILL "$pid"
wait "$pid" 2>/dev/null
gone_within_3s $ranks || fail "SIGKILL: ranks outlived fsdp-conform"
echo "ok: SIGTERM wrote the partial report and exited 143; no rank outlived SIGTERM or SIGKILL"
