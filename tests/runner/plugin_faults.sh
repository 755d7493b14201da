#!/usr/bin/env bash
# A plugin that hangs or crashes never leaves a job hanging or a results folder lying (core/common/watchdog.h,
# core/common/crash.h). plugin_faults.sh CASE TERSE FIXTURE_DIR WORK_DIR
#
# The plugin is tests/fixtures/misbehave.c: an identity compressor that hangs, crashes, overruns its output or aborts on
# demand, on one rank, from its n-th call. It creates $TERSE_MISBEHAVE_MARK when the fault starts, so the cases time
# what follows from there. Exit 0 = pass, anything else = fail with the evidence printed.
set -uo pipefail

CASE=$1
TERSE=$2
FIXTURES=$3
WORK=$4/$CASE
PLUGIN=$FIXTURES/terse_compressor_misbehave.so
rm -rf "$WORK"
mkdir -p "$WORK"
cd "$WORK" || exit 1
export TERSE_MISBEHAVE_MARK=$WORK/fault-started
# A simulated case calibrates its compute (simulation.compute CALIBRATED): into the work folder, not the user's cache.
export XDG_CACHE_HOME=$WORK/cache

fail() {
  echo "FAIL [$CASE]: $*"
  for f in "$WORK"/*.log "$WORK"/out/faults/*/status.json; do
    [[ -f $f ]] && { echo "--- $f"; tail -n 40 "$f"; }
  done
  exit 1
}
expect_in() {  # expect_in FILE REGEX
  grep -Eq -- "$2" "$1" || fail "$1 does not match /$2/"
}
# Seconds (with decimals) from the fault's start to now.
since_fault() {
  local start
  start=$(stat -c %.9Y "$TERSE_MISBEHAVE_MARK" 2>/dev/null) || fail "the fault never started ($TERSE_MISBEHAVE_MARK)"
  awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }'
}
below() {  # below X LIMIT: X < LIMIT, as decimals
  awk -v x="$1" -v l="$2" 'BEGIN { exit !(x < l) }'
}
# Linear regression, 3 epochs of 15 steps, a record every 5 steps: the fault comes after a few records.
write_study() {  # write_study FILE TRANSPORT WORKERS FAULT RANK AFTER [EXTRA]
  cat >"$1" <<EOF
study: "faults"
variant: "misbehave"
workload { name: "linear_regression" }
data { batch_size: 16 train_subset: 480 test_subset: 100 }
optimizer { lr: 0.02 momentum: 0.9 }
workers: $3
epochs: 3
eval { every_steps: 5 per_epoch: true }
seed: 7
transport: $2
plugin_timeout: "2s"
tcp { timeout: "2s" }
compressor {
  name: "$PLUGIN"
  params { key: "fault" value: "$4" }
  params { key: "rank" value: "$5" }
  params { key: "after" value: "$6" }
}
${7:-}
EOF
}
STATUS=out/faults/misbehave/status.json
METRICS=out/faults/misbehave/metrics.jsonl

# The status names the failure; its record count is what metrics.jsonl holds, and every record line is whole.
check_folder() {  # check_folder REGEX...
  expect_in $STATUS '"state":"failed"'
  for re in "$@"; do expect_in $STATUS "$re"; done
  local records lines
  records=$(grep -o '"records":[0-9]*' $STATUS | cut -d: -f2)
  lines=$(wc -l <$METRICS)
  ((records == lines)) || fail "status.json says $records records, metrics.jsonl holds $lines"
  ((lines >= 1)) || fail "no record was written before the fault (the case should fault mid-run)"
  while IFS= read -r line; do
    [[ $line == \{*\} ]] || fail "a broken record line: $line"
  done <$METRICS
}

case $CASE in
  hang_inproc | hang_simulated)
    # One rank's decompress hangs: the job fails within plugin_timeout (2 s) and the grace that lets the abort notices
    # leave (1 s), naming the plugin, the call and the tensor, instead of waiting forever.
    extra=""
    [[ $CASE == hang_simulated ]] && extra='clock: SIMULATED'
    write_study study.textproto INPROC 3 hang 1 12 "$extra"
    timeout 60 "$TERSE" run study.textproto --out out >run.log 2>&1
    rc=$?
    took=$(since_fault)
    ((rc != 124)) || fail "the run still hung after 60 s"
    ((rc == 1)) || fail "terse run exited $rc, expected 1"
    below "$took" 4.5 || fail "the run took $took s after the hang began (plugin_timeout 2 s + 1 s grace)"
    expect_in run.log "misbehave.*decompress of tensor [0-9]+ has not returned after 2\.[0-9]+ s \(plugin_timeout 2 s\)"
    check_folder "compressor 'misbehave'" "decompress of tensor" "rank 1"
    echo "[$CASE] the job ended $took s after the hang began"
    ;;
  hang_tcp)
    # Three processes; rank 1's compress hangs. Rank 1 fails at plugin_timeout and aborts its collectives, so ranks 0
    # and 2 fail at once, naming it: every rank is gone within plugin_timeout + tcp.timeout + 10% (4.4 s).
    write_study study.textproto TCP 3 hang 1 12
    sed -i 's/value: "hang" }/value: "hang" }\n  params { key: "call" value: "compress" }/' study.textproto
    timeout 60 "$TERSE" launch -n 3 --timeout 30 -- "$TERSE" run study.textproto --out out >run.log 2>&1
    rc=$?
    took=$(since_fault)
    ((rc != 124)) || fail "the job still hung after 60 s"
    ((rc == 1)) || fail "terse launch exited $rc, expected 1"
    below "$took" 4.4 || fail "the ranks took $took s to exit after the hang began (bound 4.4 s)"
    grep -q "terminating them" run.log && fail "the launcher had to terminate ranks: they did not fail on their own"
    expect_in run.log "\[rank 1\].*compressor 'misbehave'.*compress of tensor [0-9]+ has not returned"
    for r in 0 2; do expect_in run.log "\[rank $r\] terse run: .*rank 1.*misbehave"; done
    # The launcher's summary gives rank 1's own reason (its `failed` message, launch_notify.h).
    expect_in run.log "rank 1 .*exited with status 1.*it reported: rank 1: compressor 'misbehave'"
    check_folder "rank 1.*compressor 'misbehave'"
    echo "[$CASE] every rank exited $took s after the hang began"
    ;;
  overrun_inproc)
    # compress writes 4 bytes past its output: the guard bytes after the payload buffer catch it at that call, and the
    # run fails naming the plugin instead of corrupting the heap for the core to trip over later.
    write_study study.textproto INPROC 3 overrun 2 12
    sed -i 's/value: "overrun" }/value: "overrun" }\n  params { key: "call" value: "compress" }/' study.textproto
    timeout 60 "$TERSE" run study.textproto --out out >run.log 2>&1
    rc=$?
    ((rc == 1)) || fail "terse run exited $rc, expected 1"
    check_folder "compressor 'misbehave'.*compress wrote past the end of its output buffer"
    ;;
  crash_inproc | abort_inproc)
    # A fatal signal in the plugin: the process dies of it (same exit status as without the handler), but first says
    # which plugin call it was in and marks the results failed; the records already written stay.
    fault=${CASE%_inproc}
    signal=SIGSEGV
    [[ $fault == abort ]] && signal=SIGABRT
    write_study study.textproto INPROC 3 "$fault" 2 12
    timeout 60 "$TERSE" run study.textproto --out out >run.log 2>&1
    rc=$?
    ((rc != 124)) || fail "the run hung after the crash"
    expected=139
    [[ $signal == SIGABRT ]] && expected=134
    ((rc == expected)) || fail "terse run exited $rc, expected $expected (died of $signal)"
    expect_in run.log "terse: rank 2 died of $signal in compressor 'misbehave' \(.*terse_compressor_misbehave.so\), during decompress of tensor [0-9]+"
    check_folder "\"signal\":\"$signal\"" "\"plugin\":\"compressor 'misbehave'" "died of $signal"
    ;;
  crash_tcp)
    # Rank 1 dies of SIGSEGV in the plugin: the launcher names the rank and the signal, rank 0 (alive) fails naming
    # rank 1 and writes the status; the others fail within the tcp timeout.
    write_study study.textproto TCP 3 crash 1 12
    timeout 60 "$TERSE" launch -n 3 --timeout 30 -- "$TERSE" run study.textproto --out out >run.log 2>&1
    rc=$?
    ((rc == 1)) || fail "terse launch exited $rc, expected 1"
    expect_in run.log "\[rank 1\] terse: rank 1 died of SIGSEGV in compressor 'misbehave'"
    expect_in run.log "rank 1 \(pid [0-9]+\) was killed by signal 11 \(SIGSEGV\) in plugin 'misbehave' \(.*terse_compressor_misbehave.so\)"
    check_folder "rank 1"
    ;;
  crash_calibration)
    # A simulated run times its codec before it starts (simulation.compute CALIBRATED), in a child process
    # (experiments/runner/calibration.h, timeInChild): a crash there takes only the child, and the run fails with a
    # message naming the codec and the signal instead of dying of it; the study's next variant still runs.
    write_study study.textproto INPROC 3 crash 0 0 'clock: SIMULATED
variants { name: "misbehave" }
variants { name: "fp16" overrides { compressor { name: "fp16" } } }'
    sed -i '/^variant: /d' study.textproto
    sed -i 's/value: "crash" }/value: "crash" }\n  params { key: "call" value: "compress" }/' study.textproto
    timeout 60 "$TERSE" run study.textproto --out out >run.log 2>&1
    rc=$?
    ((rc != 124)) || fail "the run hung after the crash"
    ((rc == 1)) || fail "terse run exited $rc, expected 1 (a failed run, not a death by signal)"
    expect_in out/faults/fp16/status.json '"state":"completed"'
    expect_in run.log "calibration: timing codec '[^']*misbehave[^']*#[0-9a-f]+': its process died of SIGSEGV"
    expect_in $STATUS '"state":"failed"'
    expect_in $STATUS "timing codec '[^']*misbehave.*died of SIGSEGV"
    ;;
  *)
    fail "unknown case"
    ;;
esac
echo "PASS [$CASE]"
