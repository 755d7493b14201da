#!/usr/bin/env bash
# scripts/gpu-check's own flow, on a machine without a GPU: a stand-in nvidia-smi, a made-up build folder whose cuda
# tests are /bin/true or /bin/false and whose benchmarks print canned summaries, and a stand-in python3 for --torch.
# The check runs on a lent GPU machine only, minutes at a time, so a slip in the script itself (an unset variable under
# `set -u`, a failure that stops the steps after it, a wrong result that passes) would cost a lease to find. What each
# case requires:
#   clean        status 0, and the final table carries every benchmark's summary and check lines;
#   failures     a failing cuda test, a wrong PowerSGD check and a quantize plugin row unlike the plugin: status 1,
#                each named at the end, and the benchmarks after the tests still ran;
#   quantize-cut the quantize benchmark's output without its summary: status 1 (no plugin rows is no pass);
#   topk-small   the top-k benchmark's small-tensor table with a wrong row, then with a row missing: status 1 each;
#   crash        the compressor benchmark and the allreduce crashing: status 1, each named, and every step after
#                them still ran (under `set -euo pipefail` an unguarded pipeline would have ended the check);
#   skip         a cuda test skipped that no rule allows: status 1, naming it, and the benchmarks still ran;
#   cut          a benchmark past its limit (BENCH_TIMEOUT=1): killed by `timeout`, named, the next steps run;
#   deadline     GPU_CHECK_DEADLINE leaving too little for the steps after a slow one: status 1, the steps not run
#                named with the line that runs them;
#   out          OUT set: every log and the summary in $OUT/gpu-check;
#   torch        --torch with every case and the benchmark passing: status 0 (no variable of the other branch read);
#   torch-fails  --torch with the benchmark failing: status 1, naming it.
#   torch-world2 --torch with TORCH_WORLD2=1: the two-rank benchmark runs too.
#   kit-mismatch --kit and --torch with a kit whose manifest (scripts/gpu-kit's sources.sha1) is not this tree's, and
#                --kit with one without a manifest: status 1 before anything runs, saying to pack the kit again;
#   lease        --lease KIT in a stand-in tree (a stand-in for gpu-kit's --build, a kit holding the made-up build):
#                status 0, the cuda tests, the two default torch cases, the ResNet-50 table and the benchmarks in
#                that order, the logs in $OUT/gpu-check and the extension's build outside it.
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
add_test(MaybeSkip "/bin/sh" "-c" "test -z \"$ENV{FAKE_SKIP_TEST}\" || exit 77")
set_tests_properties(MaybeSkip PROPERTIES LABELS "cuda" SKIP_RETURN_CODE 77)
EOF
cat > "$work/build/bin/terse-bench-compressors-cuda" << 'EOF'
#!/usr/bin/env bash
tall_wrong="${FAKE_WRONG_TALL:-0}"
[[ -z "${FAKE_COMPRESSORS_CRASH:-}" ]] || { echo "Running terse-bench-compressors-cuda"; kill -SEGV $$; }
sleep "${FAKE_COMPRESSORS_SLEEP:-0}"
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
[[ -z "${FAKE_TERSE_CRASH:-}" ]] || { echo "terse: $*"; kill -SEGV $$; }
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
  *bench_ddp_gpu.py)
    [[ -z "${FAKE_TORCH_BENCH_FAILS:-}" ]] || { echo "bench: out of memory" >&2; exit 1; }
    echo "DDP resnet50 (25557032 parameters), batch 64, 1 rank, NCCL, stand-in"
    echo "| ddp-allreduce | 40.00 | 39.00-41.00 |  |"
    ;;
esac
echo "stand-in python3 $*"
EOF
chmod +x "$work/torchbin/python3"

# The kit of the lease case, packed before any case writes logs into the made-up build.
lease_src="$work/lease-src"
mkdir -p "$lease_src/scripts" "$lease_src/experiments/configs" "$lease_src/core" "$work/kit/gpu-kit/suite/build" \
  "$work/kit/gpu-kit/so"
lease_src="$(cd "$lease_src" && pwd -P)"
cp "$src/scripts/gpu-check" "$lease_src/scripts/"
cp "$src/scripts/gpu-kit" "$lease_src/scripts/gpu-kit.real"
cp "$src/experiments/configs/gpu_nccl.textproto" "$lease_src/experiments/configs/"
echo "// a source of the stand-in tree" > "$lease_src/core/stand_in.h"
# gpu-kit's --build compiles the extension (a compiler, pybind11, minutes): a stand-in makes its folders; the rest is
# the real script's (--check-tree, --cuda-lib-dirs).
cat > "$lease_src/scripts/gpu-kit" << 'EOF'
#!/usr/bin/env bash
set -euo pipefail
if [[ "${1:-}" == --build ]]; then
  mkdir -p "$3/python/terse" "$3/gpu-kit/fixture_plugins"
  echo "stand-in gpu-kit --build $2 $3"
  exit 0
fi
exec bash "$(dirname "$0")/gpu-kit.real" "$@"
EOF
chmod +x "$lease_src/scripts/gpu-kit"
cp -r "$work/build/." "$work/kit/gpu-kit/suite/build/"
(cd "$lease_src" && sha1sum core/stand_in.h) > "$work/kit/gpu-kit/sources.sha1"
cat > "$work/kit/gpu-kit/kit.env" << EOF
# scripts/gpu-kit of 0123456789abcdef from build, stand-in
TERSE_KIT_SOURCE_DIR='$lease_src'
TERSE_KIT_SUITE='build'
EOF
tar -cJf "$work/kit.tar.xz" -C "$work/kit" gpu-kit
# Kits that are not this tree's: a manifest naming a file of it with another sum, and no manifest at all.
mkdir -p "$work/badkit/gpu-kit" "$work/nomanifest/gpu-kit"
echo "0000000000000000000000000000000000000000  scripts/gpu-check" > "$work/badkit/gpu-kit/sources.sha1"
cp "$work/kit/gpu-kit/kit.env" "$work/badkit/gpu-kit/"
cp "$work/kit/gpu-kit/kit.env" "$work/nomanifest/gpu-kit/"
tar -cJf "$work/badkit.tar.xz" -C "$work/badkit" gpu-kit
tar -cJf "$work/nomanifest.tar.xz" -C "$work/nomanifest" gpu-kit

# check NAME EXPECTED_STATUS [gpu-check arguments...]: runs the check, leaves its output in $out. CHECK_OUT: the
# device tool's OUT (unset: none, whatever the caller's environment holds).
check() {
  local name="$1" want="$2"
  shift 2
  local got=0
  out="$work/$name.txt"
  (cd "$src" && PATH="$work/bin:$PATH" PREBUILT=1 BUILD_DIR="$work/build" BENCH_MIB=64 OUT="${CHECK_OUT:-}" \
    KIT_DIR="$work/kit-unpacked" bash scripts/gpu-check "$@") > "$out" 2>&1 || got=$?
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

FAKE_QUANTIZE_CUT=1 check quantize-cut 1
expect quantize-cut "terse-bench-quantize-cuda's plugin rows differ"

FAKE_COMPRESSORS_CRASH=1 FAKE_TERSE_CRASH=1 check crash 1
expect crash "terse-bench-compressors-cuda failed (status 139)"
expect crash "allreduce on one GPU failed (status 139)"
expect crash "# top-k selection alone"  # the steps after the crash ran
expect crash "qsgd's quantize kernel taken apart"

FAKE_SKIP_TEST=1 check skip 1
expect skip "cuda test MaybeSkip was skipped on a GPU machine"
expect skip "compress powersgd-tall"  # the benchmarks ran after the skip

BENCH_TIMEOUT=1 FAKE_COMPRESSORS_SLEEP=5 check cut 1
expect cut "terse-bench-compressors-cuda cut at its limit of 1 s"
expect cut "# top-k selection alone"

# 40 s less the 20 s kept for the kills and the summary leave 20 for the first steps; after the benchmark's 7 s, fewer
# than GPU_CHECK_MIN_STEP's 15 remain.
GPU_CHECK_DEADLINE=40 GPU_CHECK_MIN_STEP=15 FAKE_COMPRESSORS_SLEEP=7 check deadline 1
expect deadline "compressors       7 s  passed"
expect deadline "== skipped: topk (not run:"
expect deadline "not run before GPU_CHECK_DEADLINE=40 s: topk quantize allreduce"
expect deadline 'a second call runs them: GPU_CHECK_ONLY="topk quantize allreduce'

CHECK_OUT="$work/out" check out 0
for f in ctest compressors topk quantize allreduce-1 summary; do
  [[ -f "$work/out/gpu-check/$f.txt" ]] || fail "out: no $f.txt in \$OUT/gpu-check: $(ls "$work/out/gpu-check")"
done
grep -q "scripts/gpu-check: passed" "$work/out/gpu-check/summary.txt" || fail "out: summary.txt lacks the verdict"

FAKE_TOPK_SMALL_WRONG=2 check topk-small-wrong 1
expect topk-small-wrong "terse-bench-topk-cuda: a wrong selection or decode"
FAKE_TOPK_SMALL_ROWS=4 check topk-small-cut 1
expect topk-small-cut "its small-tensor table is not whole"

PATH="$work/torchbin:$PATH" check torch 0 --torch
expect torch "== experiments/pytorch/bench_ddp_gpu.py"
PATH="$work/torchbin:$PATH" FAKE_TORCH_BENCH_FAILS=1 check torch-fails 1 --torch
expect torch-fails "the hook benchmark failed (status 1)"
PATH="$work/torchbin:$PATH" TORCH_WORLD2=1 check torch-world2 0 --torch
expect torch-world2 "== experiments/pytorch/bench_ddp_gpu.py --world 2"

check kit-mismatch 1 --kit "$work/badkit.tar.xz"
expect kit-mismatch "first scripts/gpu-check."
expect kit-mismatch "run scripts/gpu-kit --suite again"
PATH="$work/torchbin:$PATH" check torch-kit-mismatch 1 --torch "$work/badkit.tar.xz"
expect torch-kit-mismatch "run scripts/gpu-kit --suite again"
check kit-no-manifest 1 --kit "$work/nomanifest.tar.xz"
expect kit-no-manifest "the kit has no manifest of its sources"

# --lease in the stand-in tree: the kit's suite unpacked into its build/, no link (the kit's source path is this tree).
out="$work/lease.txt"
got=0
(cd "$lease_src" && PATH="$work/torchbin:$work/bin:$PATH" OUT="$work/lease-out" KIT_DIR="$work/lease-kit" \
  bash scripts/gpu-check --lease "$work/kit.tar.xz") > "$out" 2>&1 || got=$?
[[ "$got" == 0 ]] || fail "lease: status $got, want 0; output:$(printf '\n')$(tail -30 "$out")"
expect lease "stand-in python3 tests/python/ddp_hook_cuda_test.py overlap"
expect lease "#   | ddp-allreduce | 40.00 |"  # the ResNet-50 table in the summary
if grep -q "ddp_hook_cuda_test.py bits_gloo2" "$out"; then fail "lease: ran bits_gloo2, not one of its cases"; fi
steps_re='^== (ctest|tests/python/ddp_hook_cuda_test.py bits_nccl|experiments/pytorch/bench_ddp_gpu.py|terse-bench-c)'
order="$(grep -nE "$steps_re" "$out" | cut -d: -f1 | paste -sd' ')"
[[ "$(wc -w <<< "$order")" == 4 && "$order" == "$(tr ' ' '\n' <<< "$order" | sort -n | paste -sd' ')" ]] ||
  fail "lease: the steps did not run in priority order (lines $order):$(printf '\n')$(grep '^==' "$out")"
for f in ctest torch-bits_nccl torch-overlap torch-bench compressors summary; do
  [[ -f "$work/lease-out/gpu-check/$f.txt" ]] || fail "lease: no $f.txt in \$OUT/gpu-check"
done
[[ -d "$lease_src/build/gpu-check-kit/python" ]] || fail "lease: the extension was not built in build/gpu-check-kit"
if find "$work/lease-out" -mindepth 2 -type d | grep -q .; then
  fail "lease: \$OUT/gpu-check is not flat: $(find "$work/lease-out" -mindepth 2 -type d)"
fi
echo "gpu_check_flow_test: 14 cases passed (17 runs of the check)"
