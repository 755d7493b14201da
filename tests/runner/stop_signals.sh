#!/usr/bin/env bash
# A `terse run` stopped by SIGTERM, SIGHUP or SIGINT marks the variant in progress failed, naming the signal, keeps its
# records, starts no later variant and ends by the signal (core/common/stop_signals.h). stop_signals.sh CASE TERSE
# WORK_DIR
#
# Each case starts a study of two variants whose first trains far longer than the test waits, sends the signal once
# the first record is written, and checks the exit status and the folders. Exit 0 = pass, anything else = fail with
# the evidence printed.
set -uo pipefail

CASE=$1
TERSE=$2
WORK=$3/$CASE
rm -rf "$WORK"
mkdir -p "$WORK"
cd "$WORK" || exit 1
# The simulated case calibrates nothing (FLOP_MODEL below); any cache still stays out of the user's.
export XDG_CACHE_HOME=$WORK/cache
FIRST=out/stopped/first
PID=

fail() {
  echo "FAIL [$CASE]: $*"
  [[ -n $PID ]] && kill -KILL "$PID" 2>/dev/null
  for f in run.log $FIRST/status.json; do
    [[ -f $f ]] && { echo "--- $f"; tail -n 30 "$f"; }
  done
  exit 1
}
expect_in() {  # expect_in FILE REGEX
  grep -Eq -- "$2" "$1" || fail "$1 does not match /$2/"
}

# Linear regression, a record every 5 steps, epochs enough for minutes: only the signal ends it.
write_study() {  # write_study FILE TRANSPORT [EXTRA]
  cat >"$1" <<EOF
study: "stopped"
workload { name: "linear_regression" }
data { batch_size: 16 train_subset: 480 test_subset: 100 }
optimizer { lr: 0.02 momentum: 0.9 }
workers: 2
epochs: 100000
eval { every_steps: 5 }
seed: 7
transport: $2
${3:-}
variants { name: "first" }
variants { name: "second" }
EOF
}

# Starts COMMAND... in the background with the stop signals at their default action (a non-interactive shell starts
# background jobs with SIGINT ignored, which terse run leaves ignored), and waits up to 60 s for the first record.
start() {
  env --default-signal=INT,TERM,HUP "$@" >run.log 2>&1 &
  PID=$!
  local deadline=$((SECONDS + 60))
  until [[ -s $FIRST/metrics.jsonl ]]; do
    kill -0 "$PID" 2>/dev/null || fail "the run ended before its first record"
    ((SECONDS < deadline)) || fail "no record within 60 s"
    sleep 0.1
  done
}

# Sends SIGNAL and checks what the stop left: exit status 128 + the signal's number, the first variant's folder
# failed naming it, its record count what metrics.jsonl holds, every record line whole, no second variant.
stop_and_check() {  # stop_and_check SIGNAL EXPECTED_RC ERROR
  local before lines records rc
  before=$(wc -l <$FIRST/metrics.jsonl)
  kill -s "$1" "$PID"
  local deadline=$((SECONDS + 60))
  while kill -0 "$PID" 2>/dev/null; do
    ((SECONDS < deadline)) || fail "still running 60 s after $1"
    sleep 0.1
  done
  wait "$PID"
  rc=$?
  PID=
  ((rc == $2)) || fail "exited $rc after $1, expected $2"
  expect_in $FIRST/status.json '"state":"failed"'
  expect_in $FIRST/status.json "\"error\":\"$3"
  expect_in $FIRST/status.json "\"signal\":\"$1\""
  records=$(grep -o '"records":[0-9]*' $FIRST/status.json | cut -d: -f2)
  lines=$(wc -l <$FIRST/metrics.jsonl)
  ((lines >= before)) || fail "metrics.jsonl lost records: $before before $1, $lines after"
  ((records == lines)) || fail "status.json says $records records, metrics.jsonl holds $lines"
  while IFS= read -r line; do
    [[ $line == \{*\} ]] || fail "a broken record line: $line"
  done <$FIRST/metrics.jsonl
  [[ -e out/stopped/second ]] && fail "the second variant started after $1"
  echo "[$CASE] $1 after $before records: exit $rc, $lines records kept"
}

case $CASE in
  term_inproc | hup_inproc | int_inproc)
    write_study study.textproto INPROC
    start "$TERSE" run study.textproto --out out
    case $CASE in
      term_inproc) stop_and_check SIGTERM 143 "terminated by SIGTERM" ;;
      hup_inproc) stop_and_check SIGHUP 129 "terminated by SIGHUP" ;;
      int_inproc) stop_and_check SIGINT 130 "interrupted \\(SIGINT\\)" ;;
    esac
    expect_in run.log "terse run: .*status failed in out/stopped/first"
    ;;
  term_async)
    # The parameter server's shards and workers, threads of one process.
    write_study study.textproto INPROC 'mode: ASYNC'
    start "$TERSE" run study.textproto --out out
    stop_and_check SIGTERM 143 "terminated by SIGTERM"
    ;;
  term_simulated)
    # The simulation runs in a forked child, which appends the records; the parent keeps the status and ends the child.
    write_study study.textproto INPROC 'clock: SIMULATED
simulation { compute: FLOP_MODEL }'
    start "$TERSE" run study.textproto --out out
    children=$(pgrep -P "$PID")
    [[ -n $children ]] || fail "no simulation process below terse run"
    stop_and_check SIGTERM 143 "terminated by SIGTERM"
    deadline=$((SECONDS + 20))
    for child in $children; do
      while kill -0 "$child" 2>/dev/null; do
        ((SECONDS < deadline)) || fail "the simulation's process $child is still there after terse run ended"
        sleep 0.1
      done
    done
    ;;
  term_launch)
    # Two ranks over tcp under terse launch, which forwards the signal to each; rank 0 writes the folder.
    write_study study.textproto TCP 'tcp { timeout: "5s" }'
    start "$TERSE" launch -n 2 --timeout 30 -- "$TERSE" run study.textproto --out out
    stop_and_check SIGTERM 143 "terminated by SIGTERM"
    expect_in run.log "got SIGTERM, forwarding it to 2 rank"
    ;;
  *)
    fail "unknown case"
    ;;
esac
echo "PASS [$CASE]"
