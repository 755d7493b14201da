#!/usr/bin/env bash
# `terse run --set` end to end: run_set.sh TERSE WORK_DIR
#
# A tiny study (linear regression, 480 examples, 3 epochs in the file and 4 in one variant) run with --set epochs=1
# --set data.batch_size=32: every variant's config.textproto holds the overrides and its metrics.jsonl stops after one
# epoch of 15 steps. --dry-run and --print-config check and list without writing. Then a refused override leaves those
# folders as they were. Exit 0 = pass.
set -uo pipefail
# shellcheck source=cli_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/cli_lib.sh" || { echo "FAIL: cannot read cli_lib.sh"; exit 1; }

TERSE=$1
WORK=$2/run_set
rm -rf "$WORK"
mkdir -p "$WORK"
cd "$WORK" || exit 1

cat >study.textproto <<EOF
study: "set"
workload { name: "linear_regression" }
data { batch_size: 16 train_subset: 480 test_subset: 100 }
optimizer { lr: 0.02 }
epochs: 3
eval { per_epoch: true }
seed: 7
compressor { name: "none" }
variants { name: "base3" }
variants { name: "long4" overrides { epochs: 4 } }
EOF

timeout 120 "$TERSE" run study.textproto --out out --set epochs=1 --set data.batch_size=32 >run.log 2>&1 ||
  fail "terse run --set exited $?"
for v in base3 long4; do
  dir=out/set/$v
  expect_in $dir/config.textproto "^epochs: 1$"
  expect_in $dir/config.textproto "^  batch_size: 32$"
  expect_in $dir/status.json '"completed"'
  # One epoch of 480 / 32 = 15 steps, not the file's 3 (or the variant's 4) epochs of 30.
  [[ $(field $dir/metrics.jsonl epoch) == 1 ]] || fail "$v: last record at epoch $(field $dir/metrics.jsonl epoch)"
  [[ $(field $dir/metrics.jsonl step) == 15 ]] || fail "$v: last record at step $(field $dir/metrics.jsonl step)"
done

# --dry-run: the same checks, then the runs it would make and their folders, and nothing written; --print-config
# shows each run's resolved config, overrides applied.
timeout 60 "$TERSE" run study.textproto --out dry --set epochs=2 --dry-run >dry.log 2>&1 || fail "--dry-run exited $?"
expect_in dry.log "base3 +dry/set/base3 +1 +SYNC +none +2"
expect_in dry.log "long4 +dry/set/long4 +1 +SYNC +none +2"
expect_in dry.log "^2 runs checked; nothing was run or written \(--dry-run\)$"
# A dense warm-up shows in the compressor's column.
timeout 60 "$TERSE" run study.textproto --out dry --variant base3 --set compressor.name=topk --set error_feedback=true \
  --set compression_start_step=7 --dry-run >warm.log 2>&1 || fail "--dry-run of a warm-up exited $?"
expect_in warm.log "base3 +dry/set/base3 +1 +SYNC +topk \+EF from step 7 +3"
# A compressor's parameters in the order of their names, for every seed: a protobuf map's order is unspecified, and the
# label once listed one variant's parameters in two orders for two seeds.
cat >params.textproto <<EOF
study: "params"
workload { name: "linear_regression" }
data { batch_size: 16 train_subset: 480 test_subset: 100 }
epochs: 1
seeds: [1, 2, 3, 4, 5, 6]
compressor {
  name: "dgc"
  params { key: "warmup_steps" value: "10" }
  params { key: "sample_ratio" value: "0.5" }
  params { key: "ratio" value: "0.1" }
  params { key: "max_passes" value: "2" }
}
EOF
timeout 60 "$TERSE" run params.textproto --out dry --dry-run >params.log 2>&1 || fail "--dry-run of params exited $?"
[[ $(grep -c "dgc max_passes=2 ratio=0.1 sample_ratio=0.5 warmup_steps=10 " params.log) == 6 ]] ||
  fail "a compressor's parameters are not listed sorted by name for every seed: $(cat params.log)"
[[ -e dry ]] && fail "--dry-run wrote $(find dry | head -3)"
timeout 60 "$TERSE" run study.textproto --out dry --set epochs=2 --variant long4 --print-config >print.log 2>&1 ||
  fail "--print-config exited $?"
expect_in print.log "^# dry/set/long4/config.textproto$"
expect_in print.log "^epochs: 2$"
expect_in print.log "^  batch_size: 16$"
grep -q "base3" print.log && fail "--print-config printed a variant not selected"
[[ -e dry ]] && fail "--print-config wrote $(find dry | head -3)"
timeout 60 "$TERSE" run study.textproto --out dry --set optimizer.lr=-1 --dry-run >dry_bad.log 2>&1
(($? == 1)) || fail "--dry-run of a refused override exited $?, expected 1"

# An override the checks refuse stops the study before anything trains; the folders written above stay as they are.
sums=$(cat out/set/*/* | md5sum)
timeout 60 "$TERSE" run study.textproto --out out --set optimizer.lr=-1 >bad.log 2>&1
(($? == 1)) || fail "a refused --set exited $?, expected 1"
expect_in bad.log "^terse run: --set optimizer.lr=-1: optimizer.lr must be > 0, got -1$"
grep -q " done" bad.log && fail "a variant ran with a refused override"
[[ $(cat out/set/*/* | md5sum) == "$sums" ]] || fail "the refused run changed the earlier results"
echo "PASS"
