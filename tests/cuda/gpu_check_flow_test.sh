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
#   many         60 failing and 30 unexpectedly skipped cuda tests: the skips in one line (count, first 10), the
#                failed-test list cut at 20, and the whole summary well within the output's last 12,000 characters;
#   no-tests     a build with no cuda-labelled test: status 1 (ctest --no-tests=error), saying so;
#   cut          a benchmark past its own limit (BENCH_TIMEOUT=1): killed by `timeout`, named, the next steps run, and
#                not offered to a second call (more time would not help it);
#   deadline     GPU_CHECK_DEADLINE leaving too little for the steps after a slow one: status 1, the steps not run
#                named with the line that runs them;
#   deadline-cut a benchmark and a torch case cut at what the deadline left (less than their own limits): offered to
#                the second call like the steps not started (TORCH_CASES for the case);
#   minimums     the per-step minimums: with 130 s ctest (150) is not started and the benchmarks (90 and less) are;
#                a benchmark whose own limit (30) fits the room runs; with 150 s --torch's ResNet-50 benchmark and its
#                two-rank run (150) are not started (offered again with TORCH_WORLD2=1), but the first is with
#                GPU_CHECK_MIN_STEPS="bench=100"; a malformed GPU_CHECK_MIN_STEPS is refused;
#   out          OUT set: $OUT/gpu-check holds summary.txt, ctest.txt and gpu-check-logs.tgz (every log) and nothing
#                else (the device tool drops files past 8), the logs themselves in the build's gpu-check/; a check
#                that stops after its start (a build without CUDA) still leaves the tarball;
#   line-buffer  the C/C++ steps (ctest and what it runs, the benchmarks) under stdbuf -oL: a stand-in sees _STDBUF_O;
#   torch        --torch with every case and the benchmark passing: status 0 (no variable of the other branch read);
#   torch-fails  --torch with the benchmark failing: status 1, naming it.
#   torch-world2 --torch with TORCH_WORLD2=1: the two-rank benchmark runs too.
#   kit-mismatch --kit and --torch with a kit whose manifest (scripts/gpu-kit's sources.sha1) is not this tree's, and
#                --kit with one without a manifest: status 1 before anything runs, saying to pack the kit again;
#   lease        --lease KIT in a stand-in tree (a stand-in for gpu-kit's --build, a kit holding the made-up build):
#                status 0, the cuda tests, the two default torch cases, the ResNet-50 table and the benchmarks in
#                that order, $OUT's three files, the logs and the extension's build in the tree's build/;
#   lease-link   the kit's source path a link left by an earlier call to another tree: pointed at this one; a real
#                folder of another tree there: status 1, saying so;
#   kit-pack     scripts/gpu-kit packing outside a git checkout, with a git that refuses the repository
#                (safe.directory), from a Makefiles build and from a Ninja build with work left (ninja -n): status 1,
#                each saying why; a current build gets past the check, also with CMake's commit check (always due)
#                at an unchanged commit, and not after a new one;
#   kit-cmake    scripts/gpu-kit --suite-cmake-files leaves out nested kits (gpu-kit/, gpu-kit-selftest/) at any
#                depth, CMakeFiles/ and the install scripts;
#   kit-stamp    scripts/gpu-kit --build (stand-ins for python3 and the compiler) reuses a build only with the same
#                CXX, TERSE_KIT_CXXFLAGS and TERSE_KIT_LDFLAGS.
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
add_test(LineBuffered "/bin/sh" "-c" "! command -v stdbuf > /dev/null || test \"$ENV{_STDBUF_O}\" = L")
set_tests_properties(LineBuffered PROPERTIES LABELS "cuda")
EOF
cat > "$work/build/bin/terse-bench-compressors-cuda" << 'EOF'
#!/usr/bin/env bash
tall_wrong="${FAKE_WRONG_TALL:-0}"
[[ -z "${FAKE_COMPRESSORS_CRASH:-}" ]] || { echo "Running terse-bench-compressors-cuda"; kill -SEGV $$; }
echo "stdout buffering: ${_STDBUF_O:-default}"
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
  *ddp_hook_cuda_test.py) sleep "${FAKE_TORCH_CASE_SLEEP:-0}" ;;
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
mkdir -p "$lease_src/scripts" "$lease_src/experiments/configs" "$lease_src/experiments/python/terse" "$lease_src/core" \
  "$work/kit/gpu-kit/suite/build" "$work/kit/gpu-kit/so" "$work/kit/gpu-kit/plugins"
lease_src="$(cd "$lease_src" && pwd -P)"
cp "$src/scripts/gpu-check" "$lease_src/scripts/"
cp "$src/scripts/gpu-kit" "$lease_src/scripts/gpu-kit.real"
cp "$src/experiments/configs/gpu_nccl.textproto" "$lease_src/experiments/configs/"
echo "// a source of the stand-in tree" > "$lease_src/core/stand_in.h"
echo "# the stand-in package" > "$lease_src/experiments/python/terse/__init__.py"
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
# What --build reads (the kit-stamp case): one source, no library.
cat > "$work/kit/gpu-kit/kit.env" << EOF
# scripts/gpu-kit of 0123456789abcdef from build, stand-in
TERSE_KIT_SOURCE_DIR='$lease_src'
TERSE_KIT_SUITE='build'
TERSE_KIT_DEFINES='' TERSE_KIT_BUILD_INCLUDES='' TERSE_KIT_STATICS='' TERSE_KIT_SHARED='' TERSE_KIT_CUDA_LIBS=''
TERSE_KIT_FLAGS='' TERSE_KIT_SOURCES='stand_in.cc'
EOF
tar -cJf "$work/kit.tar.xz" -C "$work/kit" gpu-kit
# The same kit packed from other source paths (the lease-link case): one a link an earlier call left to another tree,
# one another tree's real folder.
mkdir -p "$work/elsewhere" "$work/other-tree"
ln -s "$work/elsewhere" "$work/old-src"
for k in old-src other-tree; do
  mkdir -p "$work/kit-$k" && cp -r "$work/kit/gpu-kit" "$work/kit-$k/"
  sed -i "s|^TERSE_KIT_SOURCE_DIR=.*|TERSE_KIT_SOURCE_DIR='$work/$k'|" "$work/kit-$k/gpu-kit/kit.env"
  tar -cJf "$work/kit-$k.tar.xz" -C "$work/kit-$k" gpu-kit
done
# Kits that are not this tree's: a manifest naming a file of it with another sum, and no manifest at all.
mkdir -p "$work/badkit/gpu-kit" "$work/nomanifest/gpu-kit"
echo "0000000000000000000000000000000000000000  scripts/gpu-check" > "$work/badkit/gpu-kit/sources.sha1"
cp "$work/kit/gpu-kit/kit.env" "$work/badkit/gpu-kit/"
cp "$work/kit/gpu-kit/kit.env" "$work/nomanifest/gpu-kit/"
tar -cJf "$work/badkit.tar.xz" -C "$work/badkit" gpu-kit
tar -cJf "$work/nomanifest.tar.xz" -C "$work/nomanifest" gpu-kit

# check NAME EXPECTED_STATUS [gpu-check arguments...]: runs the check, leaves its output in $out. CHECK_OUT: the
# device tool's OUT (unset: none, whatever the caller's environment holds); CHECK_BUILD: another made-up build.
check() {
  local name="$1" want="$2"
  shift 2
  local got=0
  out="$work/$name.txt"
  (cd "$src" && PATH="$work/bin:$PATH" PREBUILT=1 BUILD_DIR="${CHECK_BUILD:-$work/build}" BENCH_MIB=64 \
    OUT="${CHECK_OUT:-}" KIT_DIR="$work/kit-unpacked" bash scripts/gpu-check "$@") > "$out" 2>&1 || got=$?
  [[ "$got" == "$want" ]] || fail "$name: status $got, want $want; output:$(printf '\n')$(tail -30 "$out")"
  if grep -q "unbound variable" "$out"; then fail "$name: $(grep "unbound variable" "$out")"; fi
}
expect() {  # expect NAME PATTERN: the last check's output holds PATTERN
  grep -qF -- "$2" "$out" || fail "$1: no '$2' in the output:$(printf '\n')$(tail -30 "$out")"
}
expect_not() {  # expect_not NAME PATTERN: the last check's output lacks PATTERN
  if grep -qF -- "$2" "$out"; then fail "$1: '$2' in the output:$(printf '\n')$(grep -F -- "$2" "$out")"; fi
}

check clean 0
expect clean "# powersgd decode (accumulated"
expect clean "# powersgd compress 300.0 us"
expect clean "qsgd's quantize kernel taken apart"
expect clean "# top-k selection alone"
expect clean "#   2^18 "
# line-buffer: ctest's LineBuffered test passed above (it sees stdbuf's setting through ctest), and so did a benchmark.
if command -v stdbuf > /dev/null; then
  grep -qx "stdout buffering: L" "$work/build/gpu-check/compressors.txt" ||
    fail "line-buffer: the compressor benchmark ran without stdbuf -oL:" \
      "$(head -2 "$work/build/gpu-check/compressors.txt")"
fi

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
expect skip "1 cuda test(s) skipped on a GPU machine, which a GPU check must run: MaybeSkip (log: "
expect skip "compress powersgd-tall"  # the benchmarks ran after the skip

# A suite that fails and skips wholesale (a broken driver), with names as long as parametrized gtest names: the end of
# the output must still hold the whole summary.
mkdir -p "$work/many"
echo "TERSE_CUDA:STRING=ON" > "$work/many/CMakeCache.txt"
for i in $(seq 1 60); do
  n="CudaPlugins/DeviceConformance.RoundTripsEveryShapeDtypeAndStreamOfTheSuite/topk_ratio_0_01_seed_$i"
  echo "add_test($n \"/bin/false\")"
  echo "set_tests_properties($n PROPERTIES LABELS \"cuda\")"
done > "$work/many/CTestTestfile.cmake"
for i in $(seq 1 30); do
  n="DeviceBuffer.CopiesAcrossStreamsWithEveryAllocatorAndAlignmentOfTheSuite/case_$i"
  echo "add_test($n \"/bin/sh\" \"-c\" \"exit 77\")"
  echo "set_tests_properties($n PROPERTIES LABELS \"cuda\" SKIP_RETURN_CODE 77)"
done >> "$work/many/CTestTestfile.cmake"
CHECK_BUILD="$work/many" GPU_CHECK_ONLY=ctest CTEST_JOBS=8 check many 1
expect many "30 cuda test(s) skipped on a GPU machine, which a GPU check must run: DeviceBuffer.CopiesAcross"
expect many " and 20 more (log: "
expect many "... 40 more in "
skip_line="$(grep 'cuda test(s) skipped on a GPU machine' "$out")"
[[ "$(grep -o 'OfTheSuite/case_' <<< "$skip_line" | wc -l)" == 10 ]] ||
  fail "many: the skips' line names other than the first 10: $skip_line"
summary_chars="$(wc -c < "$work/many/gpu-check/summary.txt")"
[[ "$summary_chars" -le 6000 ]] || fail "many: a summary of $summary_chars characters, want 6,000 at most"
tail -c 12000 "$out" | grep -q '^== terse gpu-check' ||
  fail "many: the summary's start is not in the output's last 12,000 characters"

mkdir -p "$work/no-tests"
echo "TERSE_CUDA:STRING=ON" > "$work/no-tests/CMakeCache.txt"
printf 'add_test(Unit "/bin/true")\nset_tests_properties(Unit PROPERTIES LABELS "unit")\n' \
  > "$work/no-tests/CTestTestfile.cmake"
CHECK_BUILD="$work/no-tests" GPU_CHECK_ONLY=ctest check no-tests 1
expect no-tests "ctest -L cuda found no test in $work/no-tests"

BENCH_TIMEOUT=1 FAKE_COMPRESSORS_SLEEP=5 check cut 1
expect cut "terse-bench-compressors-cuda cut at its limit of 1 s"
expect cut "# top-k selection alone"
expect_not cut "a second call runs them"  # cut at its own limit: a second call would cut it again

# 40 s less the 20 s kept for the kills and the summary leave 20 for the first steps; after the benchmark's 7 s, fewer
# than GPU_CHECK_MIN_STEP's 15 remain.
GPU_CHECK_DEADLINE=40 GPU_CHECK_MIN_STEP=15 FAKE_COMPRESSORS_SLEEP=7 check deadline 1
grep -qE '^#   compressors +[78] s  passed' "$out" ||
  fail "deadline: the benchmark did not pass in 7 s: $(tail -30 "$out")"
expect deadline "== skipped: topk (not started:"
expect deadline "under its minimum of 15 s)"
expect deadline "left out or cut short by GPU_CHECK_DEADLINE=40 s: topk quantize allreduce"
expect deadline 'a second call runs them: GPU_CHECK_ONLY="topk quantize allreduce'

# 24 s less the 20 kept leave 3 or 4 for a benchmark of 10 s and a torch case of 10: each is cut at what the deadline
# left, not at its own limit, and offered to the second call with the steps the deadline did not start.
GPU_CHECK_DEADLINE=24 GPU_CHECK_MIN_STEP=1 GPU_CHECK_ONLY="compressors topk" FAKE_COMPRESSORS_SLEEP=10 \
  check deadline-cut 1
expect deadline-cut "what GPU_CHECK_DEADLINE=24 left of its limit of 240 s"
expect deadline-cut 'a second call runs them: GPU_CHECK_ONLY="compressors topk" GPU_CHECK_DEADLINE=<seconds>'
PATH="$work/torchbin:$PATH" GPU_CHECK_DEADLINE=24 GPU_CHECK_MIN_STEP=1 TORCH_CASES="bits_nccl overlap" \
  FAKE_TORCH_CASE_SLEEP=10 check deadline-cut-torch 1 --torch
expect deadline-cut-torch "case bits_nccl cut at "
expect deadline-cut-torch 'GPU_CHECK_ONLY="torch bench" TORCH_CASES="bits_nccl overlap" GPU_CHECK_DEADLINE=<seconds>'

# The minimums themselves: 130 s leave 110, under ctest's 150 and above the benchmarks' 90, 60 and 30.
GPU_CHECK_DEADLINE=130 check minimums 1
expect minimums "== skipped: ctest (not started:"
expect minimums "under its minimum of 150 s)"
grep -qE '^#   compressors +[0-9]+ s  passed' "$out" || fail "minimums: the benchmarks did not run: $(tail -30 "$out")"
expect minimums 'a second call runs them: GPU_CHECK_ONLY="ctest"'
# A step whose own limit fits the room runs whole, whatever its minimum: 60 s leave 40, over the benchmark's 30.
GPU_CHECK_DEADLINE=60 BENCH_TIMEOUT=30 GPU_CHECK_ONLY=compressors check minimums-own-limit 0
# 150 s leave 130: the case (60) runs, the ResNet-50 benchmark and its two-rank run (150) do not, unless the
# minimum is set lower; the second call's line asks for the two-rank run again (TORCH_WORLD2=1).
PATH="$work/torchbin:$PATH" GPU_CHECK_DEADLINE=150 TORCH_CASES=overlap TORCH_WORLD2=1 check minimums-bench 1 --torch
expect minimums-bench "== skipped: bench (not started:"
expect minimums-bench 'a second call runs them: GPU_CHECK_ONLY="bench world2" TORCH_WORLD2=1 GPU_CHECK_DEADLINE='
PATH="$work/torchbin:$PATH" GPU_CHECK_DEADLINE=150 TORCH_CASES=overlap GPU_CHECK_MIN_STEPS="bench=100" \
  check minimums-override 0 --torch
expect minimums-override "#   | ddp-allreduce | 40.00 |"
GPU_CHECK_MIN_STEPS="bench=100 benhc=5" check minimums-bad 1
expect minimums-bad "GPU_CHECK_MIN_STEPS holds 'benhc=5'"

CHECK_OUT="$work/out" check out 0
got_files="$(cd "$work/out" && find . -type f | LC_ALL=C sort | paste -sd' ')"
[[ "$got_files" == "./gpu-check/ctest.txt ./gpu-check/gpu-check-logs.tgz ./gpu-check/summary.txt" ]] ||
  fail "out: \$OUT holds $got_files, want gpu-check/ctest.txt, gpu-check-logs.tgz and summary.txt alone"
in_tarball="$(tar -tzf "$work/out/gpu-check/gpu-check-logs.tgz")"
for f in ctest compressors topk quantize allreduce-1 summary; do
  grep -qx "gpu-check/$f.txt" <<< "$in_tarball" || fail "out: no gpu-check/$f.txt in gpu-check-logs.tgz: $in_tarball"
  [[ -f "$work/build/gpu-check/$f.txt" ]] || fail "out: no $f.txt in the build's gpu-check/"
done
grep -q "scripts/gpu-check: passed" "$work/out/gpu-check/summary.txt" || fail "out: summary.txt lacks the verdict"
expect out "in \$OUT/gpu-check: summary.txt, ctest.txt, gpu-check-logs.tgz"
# A check that stops after its start (here a build without CUDA): the tarball of what there is still comes back.
mkdir -p "$work/no-cuda"
echo "TERSE_CUDA:STRING=AUTO" > "$work/no-cuda/CMakeCache.txt"
CHECK_OUT="$work/out-stop" CHECK_BUILD="$work/no-cuda" check out-stop 1
expect out-stop "is configured without -DTERSE_CUDA=ON"
[[ -f "$work/out-stop/gpu-check/gpu-check-logs.tgz" ]] || fail "out-stop: no gpu-check-logs.tgz in \$OUT/gpu-check"

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

# lease NAME EXPECTED_STATUS KIT: --lease KIT in the stand-in tree, its output in $out, its OUT $work/NAME-out.
lease() {
  local name="$1" want="$2" kit="$3" got=0
  out="$work/$name.txt"
  (cd "$lease_src" && PATH="$work/torchbin:$work/bin:$PATH" OUT="$work/$name-out" KIT_DIR="$work/$name-kit" \
    bash scripts/gpu-check --lease "$kit") > "$out" 2>&1 || got=$?
  [[ "$got" == "$want" ]] || fail "$name: status $got, want $want; output:$(printf '\n')$(tail -30 "$out")"
}
# --lease in the stand-in tree: the kit's suite unpacked into its build/, no link (the kit's source path is this tree).
lease lease 0 "$work/kit.tar.xz"
expect lease "stand-in python3 tests/python/ddp_hook_cuda_test.py overlap"
expect lease "#   | ddp-allreduce | 40.00 |"  # the ResNet-50 table in the summary
if grep -q "ddp_hook_cuda_test.py bits_gloo2" "$out"; then fail "lease: ran bits_gloo2, not one of its cases"; fi
steps_re='^== (ctest|tests/python/ddp_hook_cuda_test.py bits_nccl|experiments/pytorch/bench_ddp_gpu.py|terse-bench-c)'
order="$(grep -nE "$steps_re" "$out" | cut -d: -f1 | paste -sd' ')"
[[ "$(wc -w <<< "$order")" == 4 && "$order" == "$(tr ' ' '\n' <<< "$order" | sort -n | paste -sd' ')" ]] ||
  fail "lease: the steps did not run in priority order (lines $order):$(printf '\n')$(grep '^==' "$out")"
got_files="$(cd "$work/lease-out" && find . -type f | LC_ALL=C sort | paste -sd' ')"
[[ "$got_files" == "./gpu-check/ctest.txt ./gpu-check/gpu-check-logs.tgz ./gpu-check/summary.txt" ]] ||
  fail "lease: \$OUT holds $got_files, want gpu-check/ctest.txt, gpu-check-logs.tgz and summary.txt alone"
in_tarball="$(tar -tzf "$work/lease-out/gpu-check/gpu-check-logs.tgz")"
for f in ctest torch-bits_nccl torch-overlap torch-bench compressors summary; do
  [[ -f "$lease_src/build/gpu-check/$f.txt" ]] || fail "lease: no $f.txt in the tree's build/gpu-check"
  grep -qx "gpu-check/$f.txt" <<< "$in_tarball" || fail "lease: no gpu-check/$f.txt in gpu-check-logs.tgz"
done
[[ -d "$lease_src/build/gpu-check-kit/python" ]] || fail "lease: the extension was not built in build/gpu-check-kit"
# The kit's source path a link an earlier call left to another tree: pointed here. A real folder there: refused.
GPU_CHECK_ONLY=ctest lease lease-link 0 "$work/kit-old-src.tar.xz"
[[ "$(readlink "$work/old-src")" == "$lease_src" ]] ||
  fail "lease-link: $work/old-src points at $(readlink "$work/old-src"), not at the tree $lease_src"
GPU_CHECK_ONLY=ctest lease lease-other-tree 1 "$work/kit-other-tree.tar.xz"
expect lease-other-tree "expect the source tree at $work/other-tree, which is another tree than this one"

# kit_pack NAME DIR: scripts/gpu-kit --suite build in DIR, refused (status 1) before any work; its output in $out.
kit_pack() {
  local name="$1" dir="$2" got=0
  out="$work/$name.txt"
  (cd "$dir" && GIT_CEILING_DIRECTORIES="$work" bash scripts/gpu-kit --suite build) > "$out" 2>&1 || got=$?
  [[ "$got" == 1 ]] || fail "$name: status $got, want 1; output:$(printf '\n')$(tail -30 "$out")"
}
mkdir -p "$work/no-git/scripts" "$work/no-git/build"
cp "$src/scripts/gpu-kit" "$work/no-git/scripts/"
kit_pack kit-pack-no-git "$work/no-git"
expect kit-pack-no-git "scripts/gpu-kit: git cannot read the repository at"
expect kit-pack-no-git "not a git repository"
# A git that refuses the repository as another user's (what git says then, its status 128).
mkdir -p "$work/refusing-git"
cat > "$work/refusing-git/git" << 'EOF'
#!/usr/bin/env bash
echo "fatal: detected dubious ownership in repository at '$PWD'" >&2
printf 'To add an exception for this directory, call:\n\n\tgit config --global --add safe.directory %s\n' "$PWD" >&2
exit 128
EOF
chmod +x "$work/refusing-git/git"
PATH="$work/refusing-git:$PATH" kit_pack kit-pack-safe-directory "$work/no-git"
expect kit-pack-safe-directory "(fatal: detected dubious ownership in repository at"
expect kit-pack-safe-directory "git config --global --add safe.directory"
if command -v ninja > /dev/null && command -v git > /dev/null; then
  repo="$work/kit-repo"
  mkdir -p "$repo/scripts" "$repo/build"
  cp "$src/scripts/gpu-kit" "$repo/scripts/"
  git -C "$repo" init -q
  echo "a source" > "$repo/source.txt"
  echo "CMAKE_GENERATOR:INTERNAL=Unix Makefiles" > "$repo/build/CMakeCache.txt"
  kit_pack kit-pack-makefiles "$repo"
  expect kit-pack-makefiles "build was configured with the generator 'Unix Makefiles'"
  echo "CMAKE_GENERATOR:INTERNAL=Ninja" > "$repo/build/CMakeCache.txt"
  # shellcheck disable=SC2016 # ninja's own variables
  printf 'rule copy\n  command = cp $in $out\nbuild built.txt: copy ../source.txt\n' > "$repo/build/build.ninja"
  touch -d '-1 hour' "$repo/source.txt"
  ninja -C "$repo/build" > /dev/null
  kit_pack kit-pack-current "$repo"
  expect kit-pack-current "build has no Python extension"  # past the check: the next one
  touch -d '+1 minute' "$repo/source.txt" # edited after the build
  kit_pack kit-pack-stale "$repo"
  expect kit-pack-stale "build is not current: ninja -C build -n has 1 steps to run (cp ../source.txt built.txt"
  expect kit-pack-stale "cmake --build build, then pack"
  # A build with CMake's commit check (results/CMakeLists.txt): a target always due, whose file is rewritten only when
  # the commit changed and restat, so a dry run shows the steps after it as due though a real build would not run
  # them. At an unchanged commit the build is current; after a new commit it is not, the object older than its file.
  touch -d '-1 hour' "$repo/source.txt"
  echo "commit one" > "$repo/commit.txt"
  # shellcheck disable=SC2016 # ninja's own variables
  printf '%s\n' 'rule copy' '  command = cp $in $out' 'build built.txt: copy ../source.txt' \
    'rule commit' '  command = cp -p ../commit.txt new.txt && { cmp -s new.txt commit.cc || cp new.txt commit.cc; }' \
    '  restat = 1' 'build results/CMakeFiles/terse_build_commit | commit.cc: commit' \
    'build terse_build_commit: phony results/CMakeFiles/terse_build_commit' 'build commit.o: copy commit.cc' \
    'build terse: copy commit.o' > "$repo/build/build.ninja"
  ninja -C "$repo/build" > /dev/null
  kit_pack kit-pack-commit-current "$repo"
  expect kit-pack-commit-current "build has no Python extension"
  echo "commit two" > "$repo/commit.txt"
  kit_pack kit-pack-commit-new "$repo"
  expect kit-pack-commit-new "build is not current: ninja -C build -n has 2 steps to run (cp commit.cc commit.o;cp"
  # The check's output, made for the dry run, is gone again: else the check would never run in that build again.
  [[ ! -e "$repo/build/results/CMakeFiles/terse_build_commit" ]] ||
    fail "kit-pack-commit: scripts/gpu-kit left the commit check's output behind"
else
  echo "gpu_check_flow_test: no ninja or git here: kit-pack's Ninja cases not run"
fi

# kit-cmake: ctest's files of a build, among them nested kits (the selftest's, a --torch build's) and CMake's own.
cmake_build="$work/cmake-files"
for f in CTestTestfile.cmake tests/cuda/CTestTestfile.cmake "tests/cuda/test_cuda[1]_tests.cmake" cmake_install.cmake \
  CMakeFiles/Export.cmake gpu-kit/suite/build/CTestTestfile.cmake \
  tests/python/gpu_kit_test/gpu-kit/suite/build/CTestTestfile.cmake \
  tests/python/gpu_kit_test/gpu-kit-selftest/gpu-kit/suite/build/tests/CTestTestfile.cmake \
  gpu-check-kit/gpu-kit/suite/build/CTestTestfile.cmake; do
  mkdir -p "$cmake_build/$(dirname "$f")" && : > "$cmake_build/$f"
done
got_files="$(cd "$lease_src" && bash scripts/gpu-kit.real --suite-cmake-files "$cmake_build" | LC_ALL=C sort |
  paste -sd' ')"
[[ "$got_files" == "CTestTestfile.cmake tests/cuda/CTestTestfile.cmake tests/cuda/test_cuda[1]_tests.cmake" ]] ||
  fail "kit-cmake: --suite would carry $got_files"

# kit-stamp: gpu-kit --build with stand-ins for python3 (its answers to --build's questions) and the compiler (it
# writes what -o names).
mkdir -p "$work/kit-py" "$work/py-include" "$work/cuda/include" "$work/cxx"
touch "$work/py-include/Python.h" "$work/cuda/include/cuda_runtime_api.h"
cat > "$work/kit-py/python3" << EOF
#!/usr/bin/env bash
case "\$2" in
  *EXT_SUFFIX*) echo ".stand-in.so" ;;
  *get_paths*|*get_include*) echo "$work/py-include" ;;
  *getsitepackages*) echo "$work/site-packages" ;;
  *__version__*) echo 2.13 ;;
  *python_version*) echo 3.12.0 ;;
esac
EOF
for c in c++-a c++-b; do
  cat > "$work/cxx/$c" << 'EOF'
#!/usr/bin/env bash
[[ "${1:-}" != --version ]] || { echo "stand-in c++"; exit 0; }
while [[ $# -gt 0 ]]; do
  if [[ "$1" == -o ]]; then : > "$2"; fi
  shift
done
EOF
done
chmod +x "$work/kit-py/python3" "$work/cxx/"*
# kit_build NAME CXX CXXFLAGS LDFLAGS WANT: --build of the lease kit into one folder; WANT: built or reused.
kit_build() {
  local got=0
  out="$work/$1.txt"
  (cd "$lease_src" && PYTHON="$work/kit-py/python3" CUDA_HOME="$work/cuda" CXX="$work/cxx/$2" \
    TERSE_KIT_CXXFLAGS="$3" TERSE_KIT_LDFLAGS="$4" bash scripts/gpu-kit.real --build "$work/kit.tar.xz" \
    "$work/kit-build") > "$out" 2>&1 || got=$?
  [[ "$got" == 0 ]] || fail "$1: status $got; output:$(printf '\n')$(tail -30 "$out")"
  if [[ "$5" == built ]]; then expect "$1" "scripts/gpu-kit: building the extension"; else expect "$1" "reused"; fi
}
kit_build kit-stamp-first c++-a "" "" built
kit_build kit-stamp-same c++-a "" "" reused
kit_build kit-stamp-cxx c++-b "" "" built
kit_build kit-stamp-cxxflags c++-b -O3 "" built
kit_build kit-stamp-cxxflags-same c++-b -O3 "" reused
kit_build kit-stamp-ldflags c++-b -O3 -s built
echo "gpu_check_flow_test: 23 cases passed (29 runs of the check, 12 of scripts/gpu-kit)"
