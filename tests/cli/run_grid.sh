#!/usr/bin/env bash
# A study's grid end to end: run_grid.sh TERSE WORK_DIR
#
# A tiny study (linear regression, 2 variants, simulated time, one global batch) with a grid of two link speeds and two
# worker counts:
# every variant runs at each of the 4 points, into <variant>.bandwidth-<b>.workers-<w>/, each config.textproto holding
# its point's values and grid_point; the axes reach the run (3 workers send more per worker than 2, a slower link
# takes longer); `terse compare` makes one table per point, each against its own dense run; --variant picks one
# point; --grid replaces an axis's values from the command line; a refused value stops the study before anything
# trains and leaves the folders written. Exit 0 = pass.
set -uo pipefail
# shellcheck source=cli_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/cli_lib.sh" || { echo "FAIL: cannot read cli_lib.sh"; exit 1; }

TERSE=$1
WORK=$2/run_grid
rm -rf "$WORK"
mkdir -p "$WORK"
cd "$WORK" || exit 1

cat >study.textproto <<EOF
study: "grid"
workload { name: "linear_regression" }
data { global_batch_size: 48 train_subset: 192 test_subset: 64 }
optimizer { lr: 0.02 }
epochs: 1
eval { per_epoch: true }
clock: SIMULATED
simulation { compute: FLOP_MODEL flops_per_second: 1e9 }
link { bandwidth: "1Gbps" latency: "50us" }
compressor { name: "none" }
grid { path: "link.bandwidth" values: ["1Gbps", "10Mbps"] }
grid { path: "workers" values: ["2", "3"] }
variants { name: "dense" }
variants { name: "fp16" overrides { compressor { name: "fp16" } } }
EOF

timeout 150 "$TERSE" run study.textproto --out out >run.log 2>&1 || fail "terse run exited $?"
for v in dense fp16; do
  for b in 1Gbps 10Mbps; do
    for w in 2 3; do
      dir=out/grid/$v.bandwidth-$b.workers-$w
      expect_in $dir/status.json '"completed"'
      expect_in $dir/config.textproto "^variant: \"$v.bandwidth-$b.workers-$w\"$"
      expect_in $dir/config.textproto "^workers: $w$"
      expect_in $dir/config.textproto "^  batch_size: $((48 / w))$"
      expect_in $dir/config.textproto "^  bandwidth: \"$b\"$"
      expect_in $dir/config.textproto "^grid_point \{$"
      expect_in $dir/config.textproto "^  variant: \"$v\"$"
      grep -q "^grid {" $dir/config.textproto && fail "$dir/config.textproto lists the grid; a run is one point"
    done
  done
done
# The axes reach the run: at one global batch every point takes 4 steps, and per worker a 3-rank ring sends 4/3 of a
# 2-rank one's (2(n-1)/n); a 10 Mbps link is slower.
w2=$(field out/grid/dense.bandwidth-1Gbps.workers-2/metrics.jsonl wire_bytes_per_worker)
w3=$(field out/grid/dense.bandwidth-1Gbps.workers-3/metrics.jsonl wire_bytes_per_worker)
awk -v a="$w2" -v b="$w3" 'BEGIN { exit !(b > a) }' || fail "3 workers sent $w3 bytes per worker, 2 sent $w2"
fast=$(field out/grid/dense.bandwidth-1Gbps.workers-2/metrics.jsonl wall_s)
slow=$(field out/grid/dense.bandwidth-10Mbps.workers-2/metrics.jsonl wall_s)
awk -v f="$fast" -v s="$slow" 'BEGIN { exit !(s > 1.5 * f) }' || fail "10 Mbps took $slow s, 1 Gbps $fast s"

# One table per point, in the values' natural order, each against that point's dense run.
timeout 60 "$TERSE" compare out >compare.log 2>&1 || fail "terse compare exited $?"
expect_in compare.log "^### grid at link.bandwidth=1Gbps, workers=2$"
expect_in compare.log "^### grid at link.bandwidth=10Mbps, workers=3$"
[[ $(grep -c "^### grid at" compare.log) == 4 ]] || fail "expected 4 tables, got $(grep -c '^### grid at' compare.log)"
[[ $(grep -c '^Baseline: `dense` (compressor none)' compare.log) == 4 ]] || fail "each table's baseline is dense"
grep -q "different data\|different workloads" compare.log && fail "the axes' fields (or batch_size, the global batch's share) were reported as a mismatch"
# --baseline names the file's variant, found at every point.
timeout 60 "$TERSE" compare out --baseline fp16 >baseline.log 2>&1 || fail "terse compare --baseline fp16 exited $?"
[[ $(grep -c '^Baseline: `fp16` (--baseline)' baseline.log) == 4 ]] || fail "--baseline fp16 is not every table's"
timeout 60 "$TERSE" compare out --format csv >compare.csv 2>&1 || fail "terse compare --format csv exited $?"
# then pull_residual_rel and error_feedback_rule: none; compression_start_step 0
expect_in compare.csv "^grid,fp16,false,completed,fp16,.*,link.bandwidth=10Mbps;workers=3,,,0$"

# --variant names one point; --grid gives an axis other values; --set of an axis is refused.
timeout 60 "$TERSE" run study.textproto --out dry --variant fp16.bandwidth-10Mbps.workers-2 --dry-run >one.log 2>&1 ||
  fail "--variant of one point exited $?"
expect_in one.log "^1 run checked"
timeout 60 "$TERSE" run study.textproto --out dry --grid workers=4,6,8 --variant dense --dry-run >cli.log 2>&1 ||
  fail "--grid exited $?"
expect_in cli.log "dense.bandwidth-10Mbps.workers-8 +dry/grid/dense.bandwidth-10Mbps.workers-8 +8 "
expect_in cli.log "^6 runs checked"
timeout 60 "$TERSE" run study.textproto --out dry --set workers=4 --dry-run >set.log 2>&1
(($? == 1)) || fail "--set of an axis exited $?, expected 1"
expect_in set.log "^terse run: --set workers=4: workers is an axis of the study's grid \(study.textproto:12:1: grid\[1\]\)"
[[ -e dry ]] && fail "--dry-run wrote $(find dry | head -3)"

# A value the checks refuse stops the study before anything trains; the folders written above stay as they are.
sums=$(cat out/grid/*/* | md5sum)
timeout 60 "$TERSE" run study.textproto --out out --grid link.bandwidth=1Gbps,fast >bad.log 2>&1
(($? == 1)) || fail "a refused --grid value exited $?, expected 1"
expect_in bad.log "^terse run: --grid link.bandwidth=1Gbps,fast \(link.bandwidth=fast\): link.bandwidth: bandwidth 'fast'"
grep -q " done" bad.log && fail "a variant ran with a refused grid value"
[[ $(cat out/grid/*/* | md5sum) == "$sums" ]] || fail "the refused run changed the earlier results"
echo "PASS"
