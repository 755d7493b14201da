#!/usr/bin/env bash
# scripts/gpu-check's own flow, on a machine without a GPU: a stand-in nvidia-smi, a made-up build folder whose cuda
# tests are /bin/true or /bin/false and whose benchmarks print canned summaries, and a stand-in python3 for --torch.
# The check runs on a lent GPU machine only, minutes at a time, so a slip in the script itself (an unset variable under
# `set -u`, a failure that stops the steps after it, a wrong result that passes) would cost a lease to find. What each
# case requires:
#   clean        status 0, and the final table carries every benchmark's summary and check lines;
#   failures     a failing cuda test, a wrong PowerSGD check and a quantize plugin row unlike the plugin: status 1,
#                each named at the end, and the benchmarks after the tests still ran;
#   cut          the quantize benchmark's output without its summary: status 1 (no plugin rows is no pass);
#   topk-small   the top-k benchmark's small-tensor table with a wrong row, then with a row missing: status 1 each;
#   torch        --torch with every case and the benchmark passing: status 0 (no variable of the other branch read);
#   torch-fails  --torch with the benchmark failing: status 1, naming it.
#   torch-world2 --torch with TORCH_WORLD2=1: the two-rank benchmark runs too.
# Usage: gpu_check_flow_test.sh SOURCE_DIR
set -euo pipefail
src="$(cd "$1" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fail() {
  echo "gpu_check_flow_test: $*" >&2
  exit 1
}

mkdir -p "$work/bin" "$work/build/bin"
cat > "$work/bin/nvidia-smi" << 'EOF'
#!/usr/bin/env bash
echo "GPU 0: NVIDIA Stand-in (UUID: GPU-0)"
EOF
echo "TERSE_CUDA:STRING=ON" > "$work/build/CMakeCache.txt"
# $FAKE_FAIL_TEST, $FAKE_WRONG_TALL and $FAKE_QUANTIZE_DIFF pick the failures; the fakes read them when they run.
cat > "$work/build/CTestTestfile.cmake" << 'EOF'
add_test(Pass "/bin/true")
set_tests_properties(Pass PROPERTIES LABELS "cuda")
add_test(CudaPlugins/X.ok "/bin/true")
set_tests_properties(CudaPlugins/X.ok PROPERTIES LABELS "cuda")
add_test(MaybeFail "/bin/sh" "-c" "test -z \"$ENV{FAKE_FAIL_TEST}\"")
set_tests_properties(MaybeFail PROPERTIES LABELS "cuda")
EOF
cat > "$work/build/bin/terse-bench-compressors-cuda" << 'EOF'
#!/usr/bin/env bash
tall_wrong="${FAKE_WRONG_TALL:-0}"
cat << X
summary (GB/s of f32 input, 64 MiB, device copy 2000.0 GB/s)
compressor       compress   x copy  x bound     decompress   x copy  x bound
none               1900.0     0.95     0.95         1400.0     0.70     1.05
powersgd-tall       800.0     0.40     0.43          900.0     0.45     0.46
topk 1% compress vs the full cub radix sort of (key, index) pairs: 500.0 vs 120.0 GB/s, 4.17x (target >= 3x); #wrong 0
powersgd compress 300.0 us: cuBLAS's two GEMMs alone 100.0 (P = M Q) + 100.0 (Q' = M^T P^) us; the rest 100.0 us
powersgd decode (accumulated, with its validation) vs cuBLAS's f32 GEMM of the same shapes: 1500.0 vs 1400.0 GB/s, 1.07x
powersgd rank 4, 4096 x 4096: device decode vs host ||D_dev - D_host|| / ||M|| = 1e-08 (tolerance 1e-3); #wrong 0
powersgd-tall rank 4, 131072 x 128: device decode vs host ||D_dev - D_host|| / ||M|| = 1e-08 (tolerance 1e-3); #wrong $tall_wrong
X
EOF
cat > "$work/build/bin/terse-bench-topk-cuda" << 'EOF'
#!/usr/bin/env bash
echo "summary (medians; x copy = the copy's time over the selection's, for the same input bytes)"
echo "n k copy fused 5-pass sort xcopy x5 xsort way cand #wrong"
echo "2^20 1.05e+04 3.0 30.0 40.0 300.0 0.10 1.33 10.0 candidates 1.20 0"
echo
echo "small tensors (medians of the wall time a call, 200 calls back to back; x = the grid way's time over the one ...)"
echo "n           k   fused us  one-block us  x fused  decode3 us  decode1 us  x decode #wrong"
rows="${FAKE_TOPK_SMALL_ROWS:-5}"
for b in 10 12 14 16 18; do
  [[ "$rows" -gt 0 ]] || break
  rows=$((rows - 1))
  echo "2^$b       10      60.00          8.00     7.50       30.00       15.00      2.00 ${FAKE_TOPK_SMALL_WRONG:-0}"
done
EOF
cat > "$work/build/bin/terse-bench-quantize-cuda" << 'EOF'
#!/usr/bin/env bash
diff="${FAKE_QUANTIZE_DIFF:-0}"
[[ -z "${FAKE_QUANTIZE_CUT:-}" ]] || { echo "GPU, runtime"; exit 0; }  # a run cut off before its summary
echo
echo "summary (medians, 64 MiB of f32, qsgd levels 127, buckets of 512; copy 70.0 us; the kernel's bound is 1.60x a copy)"
echo "draws   variant             us   x copy  x bound   #diff"
for r in r24 r16 r8; do
  echo "$r     plugin           160.0     0.44     0.27       $diff"
  echo "$r     reciprocal       140.0     0.50     0.31       0"
  echo "$r     packing           60.0     1.17     0.73       -"
done
echo "decode  plugin          180.0     0.39     0.44       0"
echo "decode  codes           150.0     0.47     0.52       -"
EOF
cat > "$work/build/bin/terse" << 'EOF'
#!/usr/bin/env bash
echo "# ranks 1"
echo "1048576 0 0 0 0 10.0 0.0 0"
EOF
chmod +x "$work/bin/nvidia-smi" "$work/build/bin/"*

# The stand-in python3 for --torch: every `-c` probe and every script succeeds, but the hook benchmark when
# $FAKE_TORCH_BENCH_FAILS is set.
mkdir -p "$work/torchbin"
cat > "$work/torchbin/python3" << 'EOF'
#!/usr/bin/env bash
case "${1:-}" in
  *bench_ddp_gpu.py) [[ -z "${FAKE_TORCH_BENCH_FAILS:-}" ]] || { echo "bench: out of memory" >&2; exit 1; } ;;
esac
echo "stand-in python3 $*"
EOF
chmod +x "$work/torchbin/python3"

check() {  # check NAME EXPECTED_STATUS [gpu-check arguments...]: runs the check, leaves its output in $out
  local name="$1" want="$2"
  shift 2
  local got=0
  out="$work/$name.txt"
  (cd "$src" && PATH="$work/bin:$PATH" PREBUILT=1 BUILD_DIR="$work/build" BENCH_MIB=64 \
    bash scripts/gpu-check "$@") > "$out" 2>&1 || got=$?
  [[ "$got" == "$want" ]] || fail "$name: status $got, want $want; output:$(printf '\n')$(tail -30 "$out")"
  if grep -q "unbound variable" "$out"; then fail "$name: $(grep "unbound variable" "$out")"; fi
}
expect() {  # expect NAME PATTERN: the last check's output holds PATTERN
  grep -qF -- "$2" "$out" || fail "$1: no '$2' in the output:$(printf '\n')$(tail -30 "$out")"
}

check clean 0
expect clean "# powersgd decode (accumulated"
expect clean "# powersgd compress 300.0 us"
expect clean "qsgd's quantize kernel taken apart"
expect clean "# top-k selection alone"
expect clean "#   2^18 "

FAKE_FAIL_TEST=1 FAKE_WRONG_TALL=1 FAKE_QUANTIZE_DIFF=3 check failures 1
expect failures "scripts/gpu-check: cuda tests failed"
expect failures "the compressor benchmark's checks found wrong results: powersgd-tall rank 4"
expect failures "terse-bench-quantize-cuda's plugin rows differ"
expect failures "compress powersgd-tall"  # the benchmarks ran after the failing test

FAKE_QUANTIZE_CUT=1 check cut 1
expect cut "terse-bench-quantize-cuda's plugin rows differ"

FAKE_TOPK_SMALL_WRONG=2 check topk-small-wrong 1
expect topk-small-wrong "terse-bench-topk-cuda: a wrong selection or decode"
FAKE_TOPK_SMALL_ROWS=4 check topk-small-cut 1
expect topk-small-cut "its small-tensor table is not whole"

PATH="$work/torchbin:$PATH" check torch 0 --torch
expect torch "== experiments/pytorch/bench_ddp_gpu.py"
PATH="$work/torchbin:$PATH" FAKE_TORCH_BENCH_FAILS=1 check torch-fails 1 --torch
expect torch-fails "failed: the hook benchmark"
PATH="$work/torchbin:$PATH" TORCH_WORLD2=1 check torch-world2 0 --torch
expect torch-world2 "== experiments/pytorch/bench_ddp_gpu.py --world 2"
echo "gpu_check_flow_test: 7 cases passed"
