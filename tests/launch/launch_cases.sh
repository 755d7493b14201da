#!/usr/bin/env bash
# Multi-process cases for ctest: launch_cases.sh CASE TERSE JOB_PROBE PLUGIN_DIR SOURCE_DIR WORK_DIR NOTIFY_PROBE
#
# Each case runs real processes (`terse launch`, `terse store`, `terse run` over TCP, scripts/netns-cluster) and
# checks exit codes, the words that must appear, results folders, and how long failures take to surface. Exit 0 =
# pass, 77 = skipped (the reason is printed), anything else = fail with the evidence printed.
set -uo pipefail

CASE=$1
TERSE=$2
PROBE=$3
PLUGINS=$4
SRC=$5
WORK=$6/$CASE
NOTIFY=$7
rm -rf "$WORK"
mkdir -p "$WORK"
cd "$WORK" || exit 1

fail() {
  echo "FAIL [$CASE]: $*"
  for f in "$WORK"/*.log; do
    [[ -f $f ]] && { echo "--- $f"; tail -n 60 "$f"; }
  done
  exit 1
}
expect_in() {  # expect_in FILE REGEX
  grep -Eq -- "$2" "$1" || fail "$1 does not match /$2/"
}
# A field of the last record of a metrics.jsonl, as written (no float reformatting).
field() {  # field FILE NAME
  tail -n 1 "$1" | grep -o "\"$2\":[^,}]*" | cut -d: -f2
}
# Waits until METRICS holds N records while LAUNCHER runs; fails (killing it) if it never does.
await_records() {  # await_records METRICS LAUNCHER N
  for _ in $(seq 600); do
    [[ -f $1 && $(wc -l <"$1") -ge $3 ]] && return 0
    kill -0 "$2" 2>/dev/null || break
    sleep 0.05
  done
  kill "$2" 2>/dev/null
  fail "no $3 records in $1 before the kill"
}
# The pid of rank RANK among LAUNCHER's children (read from /proc, without depending on procps); prints nothing (and
# kills the launcher) when there is none, so callers check for an empty answer: fail here would only leave $(...).
rank_pid() {  # rank_pid LAUNCHER RANK
  local stat child ppid
  for stat in /proc/[0-9]*/stat; do
    read -r child _ _ ppid _ <"$stat" 2>/dev/null || continue
    [[ $ppid == "$1" ]] || continue
    tr '\0' '\n' <"/proc/$child/environ" 2>/dev/null | grep -qx "TERSE_RANK=$2" && { echo "$child"; return 0; }
  done
  kill "$1" 2>/dev/null
}
# Waits up to SECONDS for the background LAUNCHER to end and sets rc to its exit status. When it does not end, kills it
# and every rank's process group (a stopped or sleeping rank must not outlive the test) and fails.
await_launcher() {  # await_launcher LAUNCHER SECONDS
  local deadline=$((SECONDS + $2)) stat child ppid
  while kill -0 "$1" 2>/dev/null; do
    if ((SECONDS >= deadline)); then
      for stat in /proc/[0-9]*/stat; do
        read -r child _ _ ppid _ <"$stat" 2>/dev/null || continue
        [[ $ppid == "$1" ]] && kill -KILL -- "-$child" 2>/dev/null
      done
      kill -KILL "$1" 2>/dev/null
      wait "$1" 2>/dev/null
      fail "terse launch still running $2 s later"
    fi
    sleep 0.05
  done
  wait "$1"
  rc=$?
}
# A parameter-server study whose worker rank 3 is SIGSTOPped mid-run (2 shards, 2 workers, tcp.timeout 2 s): the
# shards drop the worker, the study completes, every other rank exits 0, and the launcher -- told by rank 0 that the
# study is done -- terminates the stopped rank --timeout seconds later, naming it, instead of waiting forever.
stopped_worker() {  # stopped_worker MODE EXTRA
  cat >ps.textproto <<EOF
study: "stop"
workload { name: "linear_regression" }
data { batch_size: 16 train_subset: 960 test_subset: 100 }
optimizer { lr: 0.02 }
workers: 2
epochs: 10
eval { every_steps: 10 }
seed: 7
transport: TCP
tcp { timeout: "2s" }
mode: $1
$2
parameter_server { servers: 2 }
link { latency: "1ms" }
EOF
  "$TERSE" launch -n 4 --timeout 2 -- "$TERSE" run ps.textproto --out out --plugin-path "$PLUGINS" >run.log 2>&1 &
  local launcher=$! pid stopped_at took
  await_records out/stop/base/metrics.jsonl $launcher 2
  pid=$(rank_pid $launcher 3)
  [[ -n $pid ]] || fail "cannot find rank 3's process"
  kill -STOP "$pid"
  stopped_at=$SECONDS
  await_launcher $launcher 60
  took=$((SECONDS - stopped_at))
  ((rc == 1)) || fail "launch exited $rc, expected 1 (a rank had to be terminated)"
  ((took < 30)) || fail "the launcher took $took s to end after rank 3 was stopped"
  expect_in out/stop/base/status.json '"completed"'
  expect_in run.log "rank 3 \(pid $pid\) still running 2 s after the study completed \(stopped by SIGSTOP\); terminating it"
  expect_in run.log "the study completed \(rank 0 said so\), but 1 of 4 rank\(s\) did not end cleanly"
  expect_in run.log "rank 3 was killed by signal 15 \(SIGTERM\), terminated by the launcher"
  kill -0 "$pid" 2>/dev/null && fail "rank 3 (pid $pid) outlived the launcher"
  return 0
}
# The tiny study: linear regression, 2 epochs of 15 steps, a record every 5 steps; variants dense and top-k with
# error feedback (an allgather path), so both the allreduce and the allgather paths are compared.
write_study() {  # write_study FILE TRANSPORT WORKERS [EPOCHS [EVERY_STEPS [EXTRA]]]
  cat >"$1" <<EOF
study: "e2e"
workload { name: "linear_regression" }
data { batch_size: 16 train_subset: 480 test_subset: 100 }
optimizer { lr: 0.02 momentum: 0.9 }
workers: $3
epochs: ${4:-2}
eval { every_steps: ${5:-5} per_epoch: true }
seed: 7
transport: $2
tcp { timeout: "3s" }
compressor { name: "none" }
variants { name: "dense" }
variants { name: "topk" overrides { compressor { name: "topk" params { key: "ratio" value: "0.1" } } error_feedback: true } }
${6:-}
EOF
}
# The in-process run and the TCP run of the same study must train the same model: every record's step, accuracy,
# test and train loss and compressor payload bytes are equal to the last digit. Wire bytes are compared within 15%:
# the trainer's scheduler negotiation (an 8-byte allgather per round, core/train/sync_trainer.cc) runs a number of
# rounds that depends on thread timing, so they vary by a few frames even between two in-process runs.
compare_runs() {  # compare_runs INPROC_ROOT TCP_ROOT
  for v in dense topk; do
    local a=$1/e2e/$v/metrics.jsonl b=$2/e2e/$v/metrics.jsonl
    [[ -s $a && -s $b ]] || fail "missing metrics for $v ($a, $b)"
    [[ $(wc -l <"$a") -eq $(wc -l <"$b") ]] || fail "$v: $(wc -l <"$a") records in-process, $(wc -l <"$b") over tcp"
    for f in step test_accuracy test_loss train_loss payload_bytes_per_worker; do
      [[ $(grep -o "\"$f\":[^,}]*" "$a") == $(grep -o "\"$f\":[^,}]*" "$b") ]] ||
        fail "$v: $f differs: in-process $(field "$a" $f), over tcp $(field "$b" $f) (last record)"
    done
    local wa wb
    wa=$(field "$a" wire_bytes_per_worker)
    wb=$(field "$b" wire_bytes_per_worker)
    ((wb * 100 >= wa * 85 && wb * 100 <= wa * 115)) || fail "$v: wire bytes in-process $wa, over tcp $wb (beyond 15%)"
    expect_in "$2/e2e/$v/status.json" '"completed"'
    expect_in "$2/e2e/$v/provenance.json" '"tcp"'
  done
}

case $CASE in
  env)
    # Every rank gets its own rank, the shared world size, port and a token in terse's format (core/comm/auth.h); the
    # token is not on any command line.
    "$TERSE" launch -n 3 -- sh -c 'echo "r=$TERSE_RANK w=$TERSE_WORLD_SIZE l=$TERSE_LOCAL_RANK/$TERSE_LOCAL_WORLD_SIZE m=$TERSE_MASTER_ADDR:$TERSE_MASTER_PORT t=$TERSE_JOB_TOKEN"; tr "\0" " " </proc/$$/cmdline; echo' \
      >out.log 2>&1 || fail "launch exited $?"
    for r in 0 1 2; do expect_in out.log "^\[rank $r\] r=$r w=3 l=$r/3 m=127\.0\.0\.1:[0-9]+ t=terse-v1-[0-9a-f]{64}-[0-9a-f]{8}$"; done
    [[ $(grep -oE 't=terse-v1-[0-9a-f]{64}-[0-9a-f]{8}' out.log | sort -u | wc -l) -eq 1 ]] || fail "ranks got different tokens"
    [[ $(grep -oE 'm=[0-9.]+:[0-9]+' out.log | sort -u | wc -l) -eq 1 ]] || fail "ranks got different master ports"
    token=$(grep -oE 't=terse-v1-[0-9a-f]{64}-[0-9a-f]{8}' out.log | head -1 | cut -c3-)
    grep -v "t=$token" out.log | grep -q "$token" && fail "the token appears on a command line"
    ;;
  rendezvous)
    # Three processes really meet through rank 0's store (joinJob), authenticated with the launcher's token.
    "$TERSE" launch -n 3 -- "$PROBE" >out.log 2>&1 || fail "launch exited $?"
    for r in 0 1 2; do expect_in out.log "\[rank $r\] probe rank $r of 3 \(terse, local $r/3, master 127\.0\.0\.1:[0-9]+\) saw ranks 0,1,2"; done
    ;;
  child_fails)
    # A rank that fails is named with its status; the others get --timeout seconds, then are terminated.
    start=$SECONDS
    "$TERSE" launch -n 3 --timeout 1 -- sh -c 'if [ "$TERSE_RANK" = 1 ]; then exit 3; fi; exec sleep 30' >out.log 2>&1
    rc=$?
    ((rc == 1)) || fail "launch exited $rc, expected 1"
    ((SECONDS - start < 10)) || fail "launch took $((SECONDS - start)) s to give up"
    expect_in out.log "rank 1 \(pid [0-9]+\) exited with status 3"
    expect_in out.log "rank [02] \(pid [0-9]+\) still running 1 s after the first failure; terminating it"
    expect_in out.log "rank 0 was killed by signal 15 \(SIGTERM\)"
    "$TERSE" launch -n 2 -- sh -c '[ "$TERSE_RANK" = 1 ] && kill -9 $$; exit 0' >kill.log 2>&1
    (($? == 1)) || fail "launch with a SIGKILLed rank did not exit 1"
    expect_in kill.log "rank 1 \(pid [0-9]+\) was killed by signal 9 \(SIGKILL\)"
    "$TERSE" launch -n 2 -- "$PROBE" --exit-code-at-rank 0 4 >probe.log 2>&1
    (($? == 1)) || fail "launch with a failing probe did not exit 1"
    expect_in probe.log "rank 0 \(pid [0-9]+\) exited with status 4"
    "$TERSE" launch -n 2 -- /nonexistent/command >spawn.log 2>&1
    (($? == 1)) || fail "launch of a missing command did not exit 1"
    expect_in spawn.log "cannot start rank 0 \('/nonexistent/command'\): No such file or directory"
    ;;
  forwards_signals)
    # SIGINT to the launcher reaches every rank (each traps it and exits 7); the launcher exits 128+2.
    "$TERSE" launch -n 2 -- sh -c 'trap "echo got-int; exit 7" INT; echo ready; sleep 30 & wait' >out.log 2>&1 &
    pid=$!
    for _ in $(seq 100); do [[ $(grep -c ready out.log) -eq 2 ]] && break; sleep 0.05; done
    kill -INT $pid
    wait $pid
    rc=$?
    ((rc == 130)) || fail "launch exited $rc after SIGINT, expected 130"
    expect_in out.log "\[rank 0\] got-int"
    expect_in out.log "\[rank 1\] got-int"
    expect_in out.log "forwarding it to 2 rank"
    ;;
  external_store)
    # A standalone `terse store`: ranks with TERSE_STORE_EXTERNAL=1 meet there; a wrong token is refused (and logged)
    # and the store goes on serving.
    token=$("$TERSE" token) || fail "terse token failed"
    TERSE_JOB_TOKEN=$token TERSE_LOG_LEVEL=warn "$TERSE" store --port 0 >store.log 2>&1 &
    store=$!
    trap 'kill $store 2>/dev/null' EXIT
    for _ in $(seq 100); do grep -q "serving on" store.log && break; sleep 0.05; done
    port=$(grep -o 'serving on 127.0.0.1:[0-9]*' store.log | cut -d: -f2)
    [[ -n $port ]] || fail "terse store did not say where it serves"
    other=$("$TERSE" token) || fail "terse token failed"
    TERSE_JOB_TOKEN=$other TERSE_STORE_EXTERNAL=1 "$TERSE" launch -n 2 --master-port "$port" -- "$PROBE" >bad.log 2>&1
    (($? == 1)) || fail "ranks with the wrong token did not fail"
    expect_in bad.log "authentication failed"
    TERSE_JOB_TOKEN=$token TERSE_STORE_EXTERNAL=1 "$TERSE" launch -n 2 --master-port "$port" -- "$PROBE" >good.log 2>&1 ||
      fail "ranks with the store's token failed"
    expect_in good.log "probe rank 1 of 2 .* saw ranks 0,1"
    kill -TERM $store
    wait $store
    (($? == 0)) || fail "terse store did not stop cleanly on SIGTERM"
    expect_in store.log "dropping the connection from 127\.0\.0\.1:[0-9]+: handshake: .*does not know the job token"
    "$TERSE" store >notoken.log 2>&1 </dev/null
    (($? == 2)) || fail "terse store without a token did not exit 2"
    expect_in notoken.log "no job token"
    ;;
  token)
    # `terse token` prints a fresh token in the one format terse accepts, and nothing else; two calls differ; a store
    # and ranks take it from a 0600 file. A token a person made, or `openssl rand -hex 32`'s output, stops the job
    # before it starts, with a message that names where the token came from and how to make one, and does not show it.
    re='^terse-v1-[0-9a-f]{64}-[0-9a-f]{8}$'
    "$TERSE" token >t1.txt 2>t1.log || fail "terse token exited $?"
    "$TERSE" token >t2.txt 2>t2.log || fail "terse token exited $?"
    [[ $(wc -l <t1.txt) -eq 1 && ! -s t1.log ]] || fail "terse token printed more than one line: $(cat t1.txt t1.log)"
    expect_in t1.txt "$re"
    expect_in t2.txt "$re"
    cmp -s t1.txt t2.txt && fail "two calls of terse token printed the same token"
    # scripts/netns-cluster makes its token in the shell (its COMMAND need not be terse): the same format.
    expect_in <(bash -c "$(sed -n '/^make_token() {/,/^}/p' "$SRC/scripts/netns-cluster"); make_token") "$re"
    chmod 600 t1.txt
    TERSE_LOG_LEVEL=warn "$TERSE" store --port 0 --token-file t1.txt >store.log 2>&1 &
    store=$!
    trap 'kill $store 2>/dev/null' EXIT
    for _ in $(seq 100); do grep -q "serving on" store.log && break; sleep 0.05; done
    port=$(grep -o 'serving on 127.0.0.1:[0-9]*' store.log | cut -d: -f2)
    [[ -n $port ]] || fail "terse store did not take terse token's output"
    TERSE_JOB_TOKEN_FILE=$WORK/t1.txt TERSE_STORE_EXTERNAL=1 "$TERSE" launch -n 2 --master-port "$port" -- "$PROBE" \
      >good.log 2>&1 || fail "ranks with terse token's output failed"
    expect_in good.log "probe rank 1 of 2 .* saw ranks 0,1"
    kill -TERM $store
    wait $store
    openssl_style=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')  # 64 random hex digits, as `openssl rand -hex 32`
    for weak in 0123456789abcdef0123456789abcdef deadbeefcafebabedeadbeefcafebabe "$openssl_style"; do
      TERSE_JOB_TOKEN=$weak TERSE_STORE_EXTERNAL=1 "$TERSE" launch -n 2 --master-port "$port" -- "$PROBE" >weak.log 2>&1
      (($? != 0)) || fail "a job ran with a human-made token"
      expect_in weak.log "TERSE_JOB_TOKEN: the job token is [0-9]+ bare hexadecimal digits"
      expect_in weak.log "\(umask 077; terse token > ~/\.terse_token\)"
      grep -qF -- "$weak" weak.log && fail "the refusal shows the token"
    done
    printf 'correct horse battery staple\n' >weak.txt
    chmod 600 weak.txt
    "$TERSE" store --port 0 --token-file weak.txt >weakstore.log 2>&1 </dev/null
    (($? == 1)) || fail "terse store took a pass phrase for a token"
    expect_in weakstore.log "job token file \"?weak\.txt\"?: the job token does not start with \"terse-v1-\""
    grep -qF "horse" weakstore.log && fail "the refusal shows the token"
    ;;
  run_matches_inproc)
    # `terse launch -n N -- terse run` over TCP reports exactly what the in-process run of the same study reports.
    for n in 2 3; do
      write_study inproc$n.textproto INPROC $n
      write_study tcp$n.textproto TCP $n
      timeout 60 "$TERSE" run inproc$n.textproto --out in$n --plugin-path "$PLUGINS" >inproc$n.log 2>&1 || fail "inproc run failed"
      timeout 60 "$TERSE" launch -n $n -- "$TERSE" run tcp$n.textproto --out tcp$n --plugin-path "$PLUGINS" >tcp$n.log 2>&1 ||
        fail "tcp run of $n ranks failed"
      compare_runs in$n tcp$n
      # Only rank 0 writes results and prints the table.
      [[ $(grep -c "final acc" tcp$n.log) -eq 1 ]] || fail "more than one rank printed the results table"
    done
    # A dense warm-up (compression_start_step: top-k from step 10 of 30) over TCP is the in-process run's too.
    write_study warm_in.textproto INPROC 2 2 5 'compression_start_step: 10'
    write_study warm_tcp.textproto TCP 2 2 5 'compression_start_step: 10'
    timeout 60 "$TERSE" run warm_in.textproto --out warm_in --plugin-path "$PLUGINS" >warm_in.log 2>&1 ||
      fail "inproc warm-up run failed"
    timeout 60 "$TERSE" launch -n 2 -- "$TERSE" run warm_tcp.textproto --out warm_tcp --plugin-path "$PLUGINS" \
      >warm_tcp.log 2>&1 || fail "tcp warm-up run failed"
    compare_runs warm_in warm_tcp
    expect_in warm_tcp/e2e/topk/provenance.json '"role": *"dense_warmup"'
    # Its payload up to step 10 (the second record; payloads are cumulative) is the dense variant's; with top-k's
    # steps after it, the total is not.
    [[ $(sed -n 2p warm_tcp/e2e/topk/metrics.jsonl | grep -o '"payload_bytes_per_worker":[^,}]*') == \
       $(sed -n 2p warm_tcp/e2e/dense/metrics.jsonl | grep -o '"payload_bytes_per_worker":[^,}]*') ]] ||
      fail "the warm-up's steps did not send the dense run's payload"
    [[ $(field warm_tcp/e2e/topk/metrics.jsonl payload_bytes_per_worker) != \
       $(field warm_tcp/e2e/dense/metrics.jsonl payload_bytes_per_worker) ]] || fail "top-k never took over"
    # A job whose size is not the config's workers is refused, naming both numbers.
    "$TERSE" launch -n 2 -- "$TERSE" run tcp3.textproto --out wrong --plugin-path "$PLUGINS" >wrong.log 2>&1
    (($? == 1)) || fail "a 2-rank job ran a 3-worker study"
    expect_in wrong.log "the config has workers = 3 but this job has 2 rank"
    expect_in wrong.log "from TERSE_WORLD_SIZE, which terse launch sets"
    ;;
  local_sgd_matches_inproc)
    # Local SGD over TCP (the averagings through the same collectives, the local steps in each process) trains what
    # the in-process run trains, with a third of the gradient exchanges' bytes.
    write_study inproc.textproto INPROC 3 2 5 'local_sgd { period: 3 }'
    write_study tcp.textproto TCP 3 2 5 'local_sgd { period: 3 }'
    write_study every.textproto INPROC 3
    timeout 60 "$TERSE" run inproc.textproto --out in --plugin-path "$PLUGINS" >inproc.log 2>&1 ||
      fail "inproc run failed"
    timeout 60 "$TERSE" launch -n 3 -- "$TERSE" run tcp.textproto --out tcp --plugin-path "$PLUGINS" >tcp.log 2>&1 ||
      fail "tcp run of 3 ranks failed"
    compare_runs in tcp
    timeout 60 "$TERSE" run every.textproto --variant dense --out every --plugin-path "$PLUGINS" >every.log 2>&1 ||
      fail "the run without local SGD failed"
    local_bytes=$(field in/e2e/dense/metrics.jsonl payload_bytes_per_worker)
    every_bytes=$(field every/e2e/dense/metrics.jsonl payload_bytes_per_worker)
    # 20 steps: averagings after steps 3, 5 (evaluation), 6, 9, 10 (both), 12, 15 (both), 18, 20: 9 exchanges, not 20.
    ((local_bytes * 20 == every_bytes * 9)) || fail "local SGD sent $local_bytes payload bytes, every step $every_bytes"
    expect_in tcp/e2e/dense/config.textproto "^  period: 3$"
    ;;
  noniid_matches_inproc)
    # A non-IID split (data.partition DIRICHLET) is computed by every process from the labels and the seed alone: the
    # TCP job trains what the in-process run trains, and rank 0 records the same partition.
    for t in INPROC TCP; do
      write_study $t.textproto $t 3 1 8
      sed -i -e 's/name: "linear_regression" }/name: "mlp" hidden_sizes: [16] }/' \
        -e 's/train_subset: 480 test_subset: 100 }/train_subset: 960 test_subset: 200 partition: DIRICHLET }/' \
        -e 's/partition: DIRICHLET }/partition: DIRICHLET dirichlet_alpha: 0.2 }/' $t.textproto
    done
    timeout 60 "$TERSE" run INPROC.textproto --out in --plugin-path "$PLUGINS" >inproc.log 2>&1 ||
      fail "inproc run failed: $(tail -3 inproc.log)"
    timeout 60 "$TERSE" launch -n 3 -- "$TERSE" run TCP.textproto --out tcp --plugin-path "$PLUGINS" >tcp.log 2>&1 ||
      fail "tcp run of 3 ranks failed"
    compare_runs in tcp
    for f in in tcp; do
      grep -o '"data_partition":{[^}]*}' $f/e2e/dense/provenance.json >$f.partition || fail "$f: no data_partition"
    done
    cmp -s in.partition tcp.partition || fail "the partitions differ: $(cat in.partition) / $(cat tcp.partition)"
    expect_in in.partition '"kind":"dirichlet"'
    ;;
  noniid_ranks_disagree)
    # Ranks that drew different non-IID shards (here rank 1 with another partition_seed, as a rank reading another copy
    # of the data set would) refuse to train: every rank fails within seconds, naming each rank's partition checksum,
    # and the folder says failed.
    write_study TCP.textproto TCP 2 1 8
    sed -i -e 's/name: "linear_regression" }/name: "mlp" hidden_sizes: [16] }/' \
      -e 's/train_subset: 480 test_subset: 100 }/train_subset: 960 test_subset: 200 partition: DIRICHLET }/' \
      -e 's/partition: DIRICHLET }/partition: DIRICHLET dirichlet_alpha: 0.2 }/' TCP.textproto
    # The same in mode ASYNC, where rank 0 serves the parameters and ranks 1 and 2 train (async_rank.cc).
    sed 's/^epochs: 1/mode: ASYNC\nepochs: 1/' TCP.textproto >ASYNC.textproto
    for mode in TCP:2 ASYNC:3; do
      start=$SECONDS
      # shellcheck disable=SC2016  # expanded by the rank's shell, where TERSE_RANK is set
      timeout 60 "$TERSE" launch -n "${mode#*:}" -- sh -c 'if [ "$TERSE_RANK" = 1 ]; then
          set -- "$@" --set data.partition_seed=9; fi; exec "$@"' rank \
        "$TERSE" run "${mode%:*}.textproto" --variant dense --out "${mode%:*}" --plugin-path "$PLUGINS" \
        >"${mode%:*}.log" 2>&1 && fail "$mode: ranks with different shards trained"
      ((SECONDS - start < 30)) || fail "$mode: the refusal took $((SECONDS - start)) s"
      expect_in "${mode%:*}.log" "the ranks drew different data shards \(data\.partition DIRICHLET; partition \
checksums: rank 0 [0-9a-f]+, rank 1 [0-9a-f]+"
      expect_in "${mode%:*}/e2e/dense/status.json" '"state": *"failed"'
    done
    ;;
  set_override)
    # `terse run --set` under `terse launch`: each rank loads the study itself from the same command line, so every
    # rank applies the same overrides. A 3-worker study with --set workers=2 runs as a 2-rank job (a rank without the
    # override would refuse the job's size) and trains what the in-process run with the same overrides trains.
    write_study inproc.textproto INPROC 3
    write_study tcp.textproto TCP 3
    sets=(--set workers=2 --set epochs=1 --set optimizer.lr=0.03)
    timeout 60 "$TERSE" run inproc.textproto "${sets[@]}" --out in --plugin-path "$PLUGINS" >inproc.log 2>&1 ||
      fail "inproc run failed"
    timeout 60 "$TERSE" launch -n 2 -- "$TERSE" run tcp.textproto "${sets[@]}" --out tcp --plugin-path "$PLUGINS" \
      >tcp.log 2>&1 || fail "tcp run of 2 ranks failed"
    compare_runs in tcp
    for v in dense topk; do
      expect_in tcp/e2e/$v/config.textproto "^workers: 2$"
      expect_in tcp/e2e/$v/config.textproto "^epochs: 1$"
      expect_in tcp/e2e/$v/config.textproto "^  lr: 0.03$"
    done
    ;;
  rank_killed | rank0_killed)
    # A rank SIGKILLed mid-run: the others fail within the tcp timeout naming it; rank 0 marks the folder failed (or,
    # when rank 0 itself died, the folder stays running) and every record written so far stays readable.
    victim=1
    [[ $CASE == rank0_killed ]] && victim=0
    write_study slow.textproto TCP 3 40 2 'link { latency: "2ms" }'
    "$TERSE" launch -n 3 --timeout 20 -- "$TERSE" run slow.textproto --variant dense --out out --plugin-path "$PLUGINS" \
      >run.log 2>&1 &
    launcher=$!
    metrics=out/e2e/dense/metrics.jsonl
    await_records "$metrics" $launcher 2
    pid=$(rank_pid $launcher $victim)
    [[ -n $pid ]] || fail "cannot find rank $victim's process"
    killed_at=$SECONDS
    kill -KILL "$pid"
    wait $launcher
    rc=$?
    took=$((SECONDS - killed_at))
    ((rc == 1)) || fail "launch exited $rc, expected 1"
    ((took < 15)) || fail "the job took $took s to stop after rank $victim died (tcp timeout 3 s)"
    expect_in run.log "rank $victim \(pid $pid\) was killed by signal 9 \(SIGKILL\)"
    # The survivors fail on their own (no SIGTERM from the launcher needed), naming the dead rank.
    grep -q "; terminating it" run.log && fail "the surviving ranks had to be killed by the launcher"
    expect_in run.log "\[rank [0-9]\] terse run: .*rank $victim"
    if [[ $victim == 1 ]]; then
      expect_in out/e2e/dense/status.json '"failed"'
      expect_in out/e2e/dense/status.json "rank 1"
    else
      expect_in out/e2e/dense/status.json '"running"'
    fi
    # Every record is a whole JSON line.
    while IFS= read -r line; do
      [[ $line == \{*\} ]] || fail "a torn record: $line"
    done <"$metrics"
    ;;
  async_matches_inproc)
    # The parameter server across processes (2 shards, 2 workers, SSP with s = 0) trains the model the in-process run
    # of the same study trains: every record's step and test accuracy equal, losses equal up to the order in which a
    # shard summed the workers' pushes (arrival order), and the records carry the async fields. Both run the same rank
    # code (experiments/runner/async_rank.h), whose records hold every worker's counts as of its step that the shards'
    # snapshot holds; in lockstep that is the same step of the same protocol, so the workers' byte counts of every
    # record are equal too. (A shard's own counts are not: a worker's next pull may reach it before or after the last
    # clock of the step, whichever the transport delivers first.)
    write_async() {  # write_async FILE TRANSPORT
      cat >"$1" <<EOF
study: "ps"
workload { name: "linear_regression" }
data { batch_size: 16 train_subset: 480 test_subset: 100 }
optimizer { lr: 0.02 }
workers: 2
epochs: 2
eval { every_steps: 5 per_epoch: true }
seed: 7
transport: $2
tcp { timeout: "5s" }
mode: SSP
staleness_bound: 0
parameter_server { servers: 2 }
variants { name: "dense" }
variants { name: "topk" overrides { compressor { name: "topk" params { key: "ratio" value: "0.2" } } error_feedback: true } }
variants {
  name: "both"
  overrides {
    compressor { name: "topk" params { key: "ratio" value: "0.2" } }
    error_feedback: true
    parameter_server { pull_compressor { name: "topk" params { key: "ratio" value: "0.2" } } }
  }
}
EOF
    }
    write_async inproc.textproto INPROC
    write_async tcp.textproto TCP
    "$TERSE" run inproc.textproto --out inproc --plugin-path "$PLUGINS" >inproc.log 2>&1 || fail "in-process run exited $?"
    "$TERSE" launch -n 4 -- "$TERSE" run tcp.textproto --out tcp --plugin-path "$PLUGINS" >tcp.log 2>&1 ||
      fail "tcp run exited $?"
    # `both` pulls through top-k as well (compressed pulls): the deltas too are the same bytes in either transport.
    for v in dense topk both; do
      a=inproc/ps/$v/metrics.jsonl
      b=tcp/ps/$v/metrics.jsonl
      [[ -s $a && -s $b ]] || fail "missing metrics for $v"
      [[ $(wc -l <"$a") -eq $(wc -l <"$b") ]] || fail "$v: $(wc -l <"$a") records in-process, $(wc -l <"$b") over tcp"
      [[ $(grep -o '"step":[^,}]*' "$a") == $(grep -o '"step":[^,}]*' "$b") ]] || fail "$v: steps differ"
      for f in payload_bytes_per_worker wire_bytes_per_worker worker0_bytes_out worker1_bytes_in push_bytes_per_worker \
        pull_bytes_per_worker push_payload_bytes_per_worker pull_payload_bytes_per_worker; do
        [[ $(grep -o "\"$f\":[^,}]*" "$a") == $(grep -o "\"$f\":[^,}]*" "$b") ]] ||
          fail "$v: $f differs: $(grep -o "\"$f\":[^,}]*" "$a" | tr '\n' ' ') in process, $(grep -o "\"$f\":[^,}]*" "$b" | tr '\n' ' ') over tcp"
      done
      # linear_regression's "accuracy" is a continuous score (R^2), so it gets the losses' rounding tolerance.
      for f in test_accuracy test_loss; do
        paste -d' ' <(grep -o "\"$f\":[^,}]*" "$a" | cut -d: -f2) <(grep -o "\"$f\":[^,}]*" "$b" | cut -d: -f2) |
          awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-4 * ($1 < 0 ? -$1 : $1)) { print $1 " vs " $2; exit 1 } }' ||
          fail "$v: $f differs beyond rounding"
      done
      expect_in "$b" '"staleness_hist_0":'
      expect_in "$b" '"server1_bytes_out":'
      expect_in "$b" '"workers_live":2'
      expect_in tcp/ps/$v/status.json '"completed"'
      expect_in tcp/ps/$v/provenance.json '"ssp"'
      # Over tcp too the wire bytes are both directions, the pulls included (experiments/runner/async_detail.h).
      awk -v w="$(field "$b" wire_bytes_per_worker)" -v p="$(field "$b" push_bytes_per_worker)" \
        -v q="$(field "$b" pull_bytes_per_worker)" 'BEGIN { d = w - p - q; exit !(q > 0 && d > -1 && d < 1) }' ||
        fail "$v: wire_bytes_per_worker is not push_bytes_per_worker + pull_bytes_per_worker over tcp"
      # The final payload does not depend on timing: each worker pushed every step exactly once.
      [[ $(field "$a" payload_bytes_per_worker) == $(field "$b" payload_bytes_per_worker) ]] ||
        fail "$v: payload bytes differ"
    done
    # The pulls went through the compressor. On linear_regression's 11 parameters a top-k payload's header outweighs
    # the values it saves (4,244 bytes of pulls against 2,040): the shrink on real tensors is the in-process tests'.
    [[ $(field tcp/ps/both/metrics.jsonl pull_payload_bytes_per_worker) != \
       $(field tcp/ps/topk/metrics.jsonl pull_payload_bytes_per_worker) ]] || fail "the pulls of both were not compressed"
    expect_in tcp/ps/both/provenance.json '"role": *"pull_compressor"'
    ;;
  async_sparse_matches_inproc)
    # Row-sparse pushes and pulls (param_server_wire.h) across processes: GloVe on a small corpus, 1 shard and 2
    # workers, SSP with s = 0, sparse_gradients; the tcp run trains what the in-process run trains (steps and wire
    # bytes equal: each push and pull carries the rows its batch names, whatever the timing; losses up to summation
    # order), and the bytes are a fraction of the dense pushes'. Plain SGD: the shard applies the two pushes in arrival
    # order, which AdaGrad's accumulators would turn into a difference of 4e-4 in the loss, SGD only into rounding.
    awk 'BEGIN { srand(11); for (k = 0; k < 6000; ++k) printf "%s ", (k % 89 == 0 ? "time" : "w" int(rand() * 500)) }' \
      >corpus.txt
    write_glove() {  # write_glove FILE TRANSPORT SPARSE
      cat >"$1" <<EOF
study: "glove"
workload {
  name: "glove"
  glove { corpus: "$PWD/corpus.txt" min_count: 1 window: 3 dim: 8 cache_dir: "$PWD/cache" optimizer: SGD }
}
data { batch_size: 16 }
optimizer { lr: 0.05 }
workers: 2
epochs: 1
eval { every_steps: 50 }
seed: 3
transport: $2
tcp { timeout: "5s" }
mode: SSP
staleness_bound: 0
parameter_server { servers: 1 }
sparse_gradients: $3
EOF
    }
    write_glove inproc.textproto INPROC true
    write_glove tcp.textproto TCP true
    write_glove dense.textproto INPROC false
    "$TERSE" run inproc.textproto --out inproc --plugin-path "$PLUGINS" >inproc.log 2>&1 ||
      fail "in-process run exited $?"
    "$TERSE" run dense.textproto --out dense --plugin-path "$PLUGINS" >dense.log 2>&1 ||
      fail "in-process dense run exited $?"
    "$TERSE" launch -n 3 -- "$TERSE" run tcp.textproto --out tcp --plugin-path "$PLUGINS" >tcp.log 2>&1 ||
      fail "tcp run exited $?"
    a=$(ls inproc/glove/*/metrics.jsonl)
    b=$(ls tcp/glove/*/metrics.jsonl)
    d=$(ls dense/glove/*/metrics.jsonl)
    [[ -s $a && -s $b && -s $d ]] || fail "missing metrics"
    [[ $(grep -o '"step":[^,}]*' "$a") == $(grep -o '"step":[^,}]*' "$b") ]] || fail "steps differ"
    paste -d' ' <(grep -o '"test_loss":[^,}]*' "$a" | cut -d: -f2) <(grep -o '"test_loss":[^,}]*' "$b" | cut -d: -f2) |
      awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-4 * ($1 < 0 ? -$1 : $1)) { print $1 " vs " $2; exit 1 } }' ||
      fail "test_loss differs beyond rounding"
    sparse_bytes=$(field "$b" wire_bytes_per_worker)
    [[ $(field "$a" wire_bytes_per_worker) == "$sparse_bytes" ]] || fail "wire bytes differ: in-process vs tcp"
    awk -v s="$sparse_bytes" -v d="$(field "$d" wire_bytes_per_worker)" 'BEGIN { exit !(5 * s < d) }' ||
      fail "row frames sent $sparse_bytes bytes per worker, dense pushes $(field "$d" wire_bytes_per_worker)"
    expect_in "$(dirname "$b")/status.json" '"completed"'
    ;;
  async_elastic)
    # A worker that stops dead after 12 steps is dropped by the shard after worker_timeout, and the job completes
    # with the others, recording when it left.
    cat >el.textproto <<EOF
study: "el"
workload { name: "linear_regression" }
data { batch_size: 16 train_subset: 960 test_subset: 100 }
optimizer { lr: 0.02 }
workers: 3
epochs: 2
seed: 7
transport: TCP
tcp { timeout: "5s" }
mode: ASYNC
parameter_server { servers: 1 worker_timeout: "500ms" }
worker_settings { worker: 1 fail_after_steps: 12 }
EOF
    "$TERSE" launch -n 4 -- "$TERSE" run el.textproto --out out --plugin-path "$PLUGINS" >run.log 2>&1 ||
      fail "launch exited $?"
    m=out/el/base/metrics.jsonl
    expect_in out/el/base/status.json '"completed"'
    expect_in run.log 'worker 1 silent for more than 500 ms, dropped as dead'
    [[ $(field "$m" workers_live) == 2 ]] || fail "workers_live $(field "$m" workers_live)"
    [[ $(field "$m" worker1_left_step) == 12 ]] || fail "worker1_left_step $(field "$m" worker1_left_step)"
    # 40 steps per worker: two did all of them, the third 12; global steps = floor(92 / 3).
    [[ $(field "$m" step) == 30 ]] || fail "final step $(field "$m" step)"
    ;;
  async_shard_killed)
    # A server shard process SIGKILLed mid-run: every other rank fails within the tcp timeout naming it, and rank 0
    # marks the folder failed with its records intact.
    cat >sk.textproto <<EOF
study: "sk"
workload { name: "linear_regression" }
data { batch_size: 16 train_subset: 480 test_subset: 100 }
optimizer { lr: 0.02 }
workers: 2
epochs: 400
eval { every_steps: 15 }
seed: 7
transport: TCP
tcp { timeout: "3s" }
mode: ASYNC
parameter_server { servers: 2 }
link { latency: "1ms" }
EOF
    "$TERSE" launch -n 4 --timeout 20 -- "$TERSE" run sk.textproto --out out --plugin-path "$PLUGINS" >run.log 2>&1 &
    launcher=$!
    metrics=out/sk/base/metrics.jsonl
    await_records "$metrics" $launcher 2
    pid=$(rank_pid $launcher 1)
    [[ -n $pid ]] || fail "cannot find rank 1's process"
    killed_at=$SECONDS
    kill -KILL "$pid"
    wait $launcher
    rc=$?
    took=$((SECONDS - killed_at))
    ((rc == 1)) || fail "launch exited $rc, expected 1"
    ((took < 15)) || fail "the job took $took s to stop after shard 1 died (tcp timeout 3 s)"
    grep -q "; terminating it" run.log && fail "the surviving ranks had to be killed by the launcher"
    expect_in run.log "\[rank [023]\] terse run: .*rank 1"
    expect_in out/sk/base/status.json '"failed"'
    expect_in out/sk/base/status.json "rank 1"
    while IFS= read -r line; do
      [[ $line == \{*\} ]] || fail "a torn record: $line"
    done <"$metrics"
    ;;
  async_worker_killed)
    # A worker process SIGKILLed mid-run: the shard drops it (its connection failed; workers are expendable ranks of
    # the tcp transport) and the others finish the run; the records say when it left. The launcher still reports the
    # killed rank (exit 1) but lets the others finish within --timeout.
    cat >wk.textproto <<EOF
study: "wk"
workload { name: "linear_regression" }
data { batch_size: 16 train_subset: 960 test_subset: 100 }
optimizer { lr: 0.02 }
workers: 3
epochs: 30
eval { every_steps: 20 }
seed: 7
transport: TCP
tcp { timeout: "3s" }
mode: ASYNC
parameter_server { servers: 1 }
link { latency: "1ms" }
EOF
    "$TERSE" launch -n 4 --timeout 60 -- "$TERSE" run wk.textproto --out out --plugin-path "$PLUGINS" >run.log 2>&1 &
    launcher=$!
    metrics=out/wk/base/metrics.jsonl
    await_records "$metrics" $launcher 2
    pid=$(rank_pid $launcher 2)
    [[ -n $pid ]] || fail "cannot find rank 2's process"
    kill -KILL "$pid"
    wait $launcher
    rc=$?
    ((rc == 1)) || fail "launch exited $rc, expected 1 (a rank was killed)"
    grep -q "; terminating it" run.log && fail "the surviving ranks had to be killed by the launcher"
    expect_in run.log 'worker 1 lost its connection, dropped as dead'
    expect_in out/wk/base/status.json '"completed"'
    [[ $(field "$metrics" workers_live) == 2 ]] || fail "workers_live $(field "$metrics" workers_live)"
    left=$(field "$metrics" worker1_left_step)
    [[ -n $left ]] && ((left > 0 && left < 60 * 30)) || fail "worker1_left_step '$left'"
    ;;
  notify_channel)
    # The control channel (core/common/launch_notify.h) through the library's own calls. Once a rank says the study is
    # done, a rank that never ends is named and terminated after --timeout: one asleep, one stopped (SIGCONT after
    # the SIGTERM), one asleep under a shell that runs the probe (the channel survives exec).
    start=$SECONDS
    "$TERSE" launch -n 3 --timeout 2 -- "$NOTIFY" 0:done 1:sleep >sleep.log 2>&1 &
    await_launcher $! 30
    ((rc == 1)) || fail "launch exited $rc with a rank terminated after the study, expected 1"
    ((SECONDS - start < 10)) || fail "launch took $((SECONDS - start)) s to end 2 s after the study completed"
    for r in 0 1 2; do expect_in sleep.log "\[rank $r\] notify probe rank $r: channel on"; done
    expect_in sleep.log "rank 1 \(pid [0-9]+\) still running 2 s after the study completed; terminating it"
    expect_in sleep.log "the study completed \(rank 0 said so\), but 1 of 3 rank\(s\) did not end cleanly"
    expect_in sleep.log "rank 1 was killed by signal 15 \(SIGTERM\), terminated by the launcher"
    grep -Eq "rank [02] (was killed|exited)" sleep.log && fail "ranks 0 and 2 exited 0 but were listed"
    "$TERSE" launch -n 2 --timeout 1 --no-prefix -- "$NOTIFY" 0:done 1:stop >stop.log 2>&1 &
    await_launcher $! 30
    ((rc == 1)) || fail "launch exited $rc with a stopped rank terminated, expected 1"
    expect_in stop.log "rank 1 \(pid [0-9]+\) still running 1 s after the study completed \(stopped by SIGSTOP\)"
    expect_in stop.log "rank 1 was killed by signal 15 \(SIGTERM\), terminated by the launcher"
    "$TERSE" launch -n 2 --timeout 1 -- sh -c '"$0" 0:done 1:sleep; exit 0' "$NOTIFY" >shell.log 2>&1 &
    await_launcher $! 30
    ((rc == 1)) || fail "launch exited $rc with a shell rank terminated, expected 1"
    expect_in shell.log "rank 1 \(pid [0-9]+\) still running 1 s after the study completed; terminating it"
    # Done, and everyone ends: 0, and no summary.
    "$TERSE" launch -n 3 --timeout 1 -- "$NOTIFY" 2:done >done.log 2>&1 || fail "launch of a completed study exited $?"
    grep -Eq "did not end cleanly|failed" done.log && fail "a clean run printed a summary"
    # A rank that exits 0 starts no clock: the slow one is not terminated.
    "$TERSE" launch -n 2 --timeout 1 -- sh -c '[ "$TERSE_RANK" = 1 ] && sleep 3; exit 0' >slow.log 2>&1 ||
      fail "launch with a slow rank exited $? (terminated after another rank exited 0?)"
    # A crash report names the plugin in which the rank died; a failure report gives the reason in the summary.
    "$TERSE" launch -n 2 --timeout 1 -- "$NOTIFY" 0:crash 1:sleep >crash.log 2>&1 &
    await_launcher $! 30
    ((rc == 1)) || fail "launch exited $rc after a crash, expected 1"
    expect_in crash.log "rank 0 \(pid [0-9]+\) reports a crash: SIGSEGV in plugin 'hang-decomp' \(/plugins/lib hang\.so\); waiting up to 1 s"
    expect_in crash.log "rank 0 was killed by signal 11 \(SIGSEGV\) in plugin 'hang-decomp' \(/plugins/lib hang\.so\)$"
    expect_in crash.log "rank 1 \(pid [0-9]+\) still running 1 s after the first failure; terminating it"
    "$TERSE" launch -n 2 --timeout 1 -- "$NOTIFY" '0:fail=variant x of study y broke: z,exit=1' >fail.log 2>&1
    (($? == 1)) || fail "launch with a failing rank did not exit 1"
    expect_in fail.log "rank 0 \(pid [0-9]+\) reports its run failed: variant x of study y broke: z; waiting"
    expect_in fail.log "1 of 2 rank\(s\) failed:"
    expect_in fail.log "rank 0 exited with status 1; it reported: variant x of study y broke: z$"
    ;;
  liveness_stopped_peer)
    # The liveness promise (docs/clusters.md, core/comm/tcp/transport.h): with tcp.timeout 2 s, the survivors of a
    # SIGSTOPped rank fail naming it within 2 s + 5% of the stop and exit within 2 s + 10% (a process's teardown, its
    # frees and joins, takes 60-100 ms on the 2-core development machine: exits measured 2.09-2.14 s, failures
    # 2.00-2.02 s). Measured from the stop to each `terse run` process's exit, which a wrapper shell notes. Other work
    # on the machine can delay a process's exit, so the bound must hold in one of three tries, and every try within
    # 2 s + 50%.
    cat >live.textproto <<EOF
study: "live"
workload { name: "linear_regression" }
data { batch_size: 16 train_subset: 480 test_subset: 100 }
optimizer { lr: 0.02 momentum: 0.9 }
workers: 3
epochs: 40
eval { every_steps: 2 }
seed: 7
transport: TCP
tcp { timeout: "2s" }
link { latency: "2ms" }
EOF
    met=0
    for try in 1 2 3; do
      rm -rf out pid.* exit.*
      "$TERSE" launch -n 3 --timeout 2 -- bash -c '"$0" run live.textproto --out out --plugin-path "$1" &
        echo $! >pid.$TERSE_RANK; wait $!; rc=$?; echo "$EPOCHREALTIME" >exit.$TERSE_RANK; exit $rc' \
        "$TERSE" "$PLUGINS" >live$try.log 2>&1 &
      launcher=$!
      await_records out/live/base/metrics.jsonl $launcher 3
      kill -STOP "$(cat pid.1)"
      stopped=$EPOCHREALTIME
      await_launcher $launcher 60
      ((rc == 1)) || fail "launch exited $rc, expected 1"
      line="try $try:"
      ok=1
      for r in 0 2; do
        [[ -f exit.$r ]] || fail "rank $r's run never ended"
        expect_in live$try.log "\[rank $r\] terse run: .*rank 1 \(host [^)]*\) has sent nothing for"
        took=$(awk -v a="$stopped" -v b="$(cat exit.$r)" 'BEGIN { printf "%.3f", b - a }')
        line+=" rank $r exited $took s after the stop;"
        awk -v t="$took" 'BEGIN { exit !(t <= 3.0) }' || fail "$line beyond 2 s + 50%"
        awk -v t="$took" 'BEGIN { exit !(t <= 2.2) }' || ok=0
      done
      echo "$line"
      ((ok)) && { met=1; break; }
    done
    ((met)) || fail "no try in which every survivor exited within 2 s + 10% of the stop"
    ;;
  async_worker_stopped)
    stopped_worker ASYNC ""
    expect_in run.log 'worker 1 (lost its connection|silent for more than [0-9]+ ms), dropped as dead'
    ;;
  ssp_worker_stopped)
    stopped_worker SSP "staleness_bound: 2"
    expect_in run.log 'worker 1 (lost its connection|silent for more than [0-9]+ ms), dropped as dead'
    ;;
  netns)
    # Three "hosts" (network namespaces with their own addresses, host names and a 1 Gbit/s shaped link) run the tiny
    # study over TCP: the store, binding and transport work across addresses, and match the in-process numbers.
    if [[ $(id -u) -ne 0 ]]; then echo "SKIP: needs root for network namespaces"; exit 77; fi
    if ! command -v ip >/dev/null; then echo "SKIP: iproute2 (ip) is not installed"; exit 77; fi
    probe_ns="terse-probe-$$"
    if ! ip netns add "$probe_ns" 2>/dev/null; then echo "SKIP: ip netns does not work here"; exit 77; fi
    ip netns del "$probe_ns"
    write_study inproc.textproto INPROC 3
    write_study tcp.textproto TCP 3
    timeout 60 "$TERSE" run inproc.textproto --out in --plugin-path "$PLUGINS" >inproc.log 2>&1 || fail "inproc run failed"
    shaping=()
    command -v tc >/dev/null && shaping=(--rate 1gbit)  # tc ships with iproute2 on Debian; shape when present
    "$SRC/scripts/netns-cluster" 3 "${shaping[@]}" --timeout 120 -- "$TERSE" run tcp.textproto --out "$WORK/tcp" \
      --plugin-path "$PLUGINS" >netns.log 2>&1 || fail "netns-cluster run failed"
    compare_runs in tcp
    expect_in netns.log "all 3 ranks exited 0"
    expect_in tcp/e2e/dense/provenance.json '10\.233\.0\.1:29500'
    # A rank that fails in one namespace fails the job with its host named; everything is cleaned up.
    "$SRC/scripts/netns-cluster" 2 --timeout 60 -- "$PROBE" --exit-code-at-rank 1 5 >fail.log 2>&1
    (($? == 5)) || fail "netns-cluster did not pass on rank 1's status 5"
    expect_in fail.log "rank 1 \(host node1\) exited with status 5"
    expect_in fail.log "\[host 0\] probe rank 0 of 2 \(terse, local 0/1, master 10\.233\.0\.1:29500\) saw ranks 0,1"
    ip netns list | grep -q "terse-" && fail "namespaces left behind: $(ip netns list)"
    ;;
  *)
    echo "unknown case $CASE"
    exit 2
    ;;
esac
echo "PASS [$CASE]"
