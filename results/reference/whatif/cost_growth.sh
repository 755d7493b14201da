#!/bin/bash
# The simulation's own cost against the number of workers (README.md here, "Cost of the simulation itself"): runs
# the quickstart MLP {256, 128}, dense, 4 images per worker, FLOP model, on the 8xH100-8x400G preset, for two step
# counts per world size, and prints CPU seconds and peak RSS of each run; the difference between the two step counts
# over their difference is the cost of one simulated step without the setup (replicas, data, platform).
# Usage: cost_growth.sh [TERSE] [OUTDIR]   (TERSE default build/bin/terse; needs /usr/bin/time)
set -euo pipefail
terse=${1:-build/bin/terse}
out=${2:-/tmp/terse-cost-growth}
mkdir -p "$out"
for spec in "8 5 25" "64 5 15" "256 2 4" "1024 1 2"; do
  read -r n s1 s2 <<<"$spec"
  for s in $s1 $s2; do
    cfg=$out/cost_${n}_${s}.textproto
    cat >"$cfg" <<EOC
study: "cost_${n}_${s}"
workload { name: "mlp" hidden_sizes: [256, 128] }
data { dataset_dir: "/usr/share/datasets/fashion-mnist" batch_size: 4 train_subset: $((n * 4 * s)) test_subset: 100 }
optimizer { lr: 0.05 momentum: 0.9 }
workers: $n
clock: SIMULATED
simulation { compute: FLOP_MODEL topology { preset: "8xH100-8x400G" } }
compressor { name: "none" }
epochs: 1
eval { per_epoch: true }
seed: 1
EOC
    /usr/bin/time -f "workers=$n steps=$s cpu_s=%U+%S peak_rss_kb=%M wall_s=%e" "$terse" run "$cfg" --out "$out/runs" \
      >/dev/null 2>"$out/time_${n}_${s}.txt" || { cat "$out/time_${n}_${s}.txt" >&2; exit 1; }
    tail -1 "$out/time_${n}_${s}.txt"
  done
done
