#!/usr/bin/env bash
# `terse whatif` of a run with a dense warm-up (compression_start_step): whatif_warmup.sh TERSE WORK_DIR
#
# A tiny study (linear regression, 30 steps, a step trace) with top-k from step 10. The trace's header says where the
# warm-up ended; the replay sets its 10 steps aside and replays the 20 of top-k, saying so; the time to an accuracy
# counts the warm-up's steps at their own step time. A run that ends inside its warm-up is replayed as recorded, with
# a note that it holds allreduces of none only. A compressor's own warm-up (dgc's, over steps 0-7: its phases,
# terse/phases_v1.h) after a dense one of 4 steps is set aside to its end, step 8, and said so; so is one alone, and
# one longer than the run is the run's warning. Exit 0 = pass.
set -uo pipefail
# shellcheck source=cli_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/cli_lib.sh" || { echo "FAIL: cannot read cli_lib.sh"; exit 1; }

TERSE=$1
WORK=$2/whatif_warmup
rm -rf "$WORK"
mkdir -p "$WORK"
cd "$WORK" || exit 1

cat >study.textproto <<STUDY
study: "warm"
workload { name: "linear_regression" }
data { batch_size: 16 train_subset: 480 test_subset: 100 }
optimizer { lr: 0.02 momentum: 0.9 }
workers: 2
epochs: 2
eval { every_steps: 5 per_epoch: true }
seed: 7
step_trace: true
compressor { name: "topk" params { key: "ratio" value: "0.5" } }
error_feedback: true
compression_start_step: 10
variants { name: "warm10" }
variants { name: "warm99" overrides { compression_start_step: 99 } }
variants {
  name: "dgcwarm"
  overrides {
    compressor { name: "dgc" params { key: "warmup_steps" value: "8" } }
    compression_start_step: 4
  }
}
variants {
  name: "dgconly"
  overrides {
    compressor { name: "dgc" params { key: "warmup_steps" value: "8" } }
    compression_start_step: 0
  }
}
variants {
  name: "dgclong"
  overrides {
    compressor { name: "dgc" params { key: "warmup_steps" value: "40" } }
    compression_start_step: 0
  }
}
STUDY
timeout 120 "$TERSE" run study.textproto --out out >run.log 2>&1 || fail "terse run exited $?"
expect_in out/warm/warm10/steps.rank0.jsonl '"compression_start_step":10'
expect_in out/warm/warm99/steps.rank0.jsonl '"compression_start_step":99'
expect_in run.log "warning: \[warm99\] compression_start_step 99 is at or past the run's last step \(30 steps\)"

timeout 120 "$TERSE" whatif out/warm/warm10 --workers 4 --bandwidth 1Gbps --latency 50us --target-accuracy 0.01 \
  >warm10.log 2>&1 || fail "whatif of warm10 exited $?"
expect_in warm10.log "^warm-up: the first 10 recorded steps are the dense warm-up's \(compression_start_step 10\): \
replaying the 20 of topk:ratio=0.5 after them$"
expect_in warm10.log "replayed at 4 workers, 20 steps"
expect_in warm10.log "time to target accuracy .*\(5 steps, 5 of them the dense warm-up's;"
timeout 120 "$TERSE" whatif out/warm/warm10 --workers 4 --bandwidth 1Gbps --json warm10.json >/dev/null 2>&1 ||
  fail "whatif --json of warm10 exited $?"
expect_in warm10.json '"compression_start_step": 10'
expect_in warm10.json '"steps_set_aside": 10'
expect_in warm10.json '"steps": 20'
# A target first reached at step 25 (accuracy 0.977; 0.92 at step 10, then 0.78 and 0.90): 10 steps at the warm-up's
# replayed step time, 15 at top-k's.
timeout 120 "$TERSE" whatif out/warm/warm10 --workers 4 --bandwidth 1Gbps --target-accuracy 0.95 --json late.json \
  >/dev/null 2>&1 || fail "whatif --target-accuracy 0.95 of warm10 exited $?"
python3 - late.json <<'CHECK' || fail "late.json: the time to accuracy is not the two phases' sum"
import json, sys
j = json.load(open(sys.argv[1]))
t, w = j["time_to_accuracy"], j["warmup"]
assert t["step"] == 25 and t["warmup_steps"] == 10, t
want = 10 * w["mean_step_s"] + 15 * j["mean_step_s"]
assert abs(t["seconds"] - want) <= 1e-9 * want, (t["seconds"], want)
assert w["mean_step_s"] != j["mean_step_s"], w
CHECK

timeout 120 "$TERSE" whatif out/warm/warm99 --workers 4 --bandwidth 1Gbps >warm99.log 2>&1 ||
  fail "whatif of warm99 exited $?"
expect_in warm99.log "^warm-up: every recorded step is of the dense warm-up \(compression_start_step 99\): this \
replays allreduces of none, not of topk:ratio=0.5"
expect_in warm99.log "replayed at 4 workers, 30 steps"

expect_in out/warm/dgcwarm/steps.rank0.jsonl '"compression_start_step":4,"compressor_phases_end":8'
timeout 120 "$TERSE" whatif out/warm/dgcwarm --workers 4 --bandwidth 1Gbps --json dgcwarm.json >dgcwarm.log 2>&1 ||
  fail "whatif of dgcwarm exited $?"
expect_in dgcwarm.log "^warm-up: the first 8 recorded steps are the dense warm-up \(compression_start_step 4\) and \
dgc:warmup_steps=8's own warm-up \(its phases, to step 8\): replaying the 22 of dgc:warmup_steps=8 \
after them$"
expect_in dgcwarm.json '"compressor_phases_end": 8'
expect_in dgcwarm.json '"steps_set_aside": 8'
# The compressor's own warm-up alone: set aside the same way, the JSON's compression_start_step 0 and its end 8.
timeout 120 "$TERSE" whatif out/warm/dgconly --workers 4 --bandwidth 1Gbps --json dgconly.json >dgconly.log 2>&1 ||
  fail "whatif of dgconly exited $?"
expect_in dgconly.log "^warm-up: the first 8 recorded steps are dgc:warmup_steps=8's own warm-up \(its phases, to step \
8\): replaying the 22 of dgc:warmup_steps=8 after them$"
expect_in dgconly.json '"compression_start_step": 0'
expect_in dgconly.json '"end": 8'
# A compressor warm-up longer than the run is a warning of the run's.
expect_in run.log "warning: \[dgclong\] compressor 'dgc' changes its work per step until step 40 \(its phases, e.g. \
dgc's warm-up\), at or past the run's last step \(30 steps\)"
echo "PASS"
