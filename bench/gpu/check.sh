#!/usr/bin/env bash
# GPU check: builds kvtier with CUDA (sm_90), runs the CUDA tests (label gpu) and the GPU
# benchmarks, and writes everything under $OUT (default ./gpu-check-out). Meant for a machine with
# an NVIDIA GPU (H100/H200); it takes a few minutes.
#
#   bench/gpu/check.sh            # build in build-gpu, test, benchmark
#   OUT=/some/dir bench/gpu/check.sh
#
# What it reports (JSON files under $OUT, and a summary on stdout):
#   tiers.json   kvtier-bench io --gpu: pinned H2D/D2H throughput of the transfer engine against a
#                plain cudaMemcpyAsync of the same bytes (aim >= 0.9)
#   tiers_fp8.json  the same with the host tier in fp8: the page codec kernels reading HBM and
#                writing pinned memory (and back) against a plain copy of the bf16 pages (> 1 means
#                the halved PCIe bytes pay for the codec)
#   attn.json    kvtier-bench attn --device cuda: split-K decode attention, GB/s of KV read against
#                the device's measured copy bandwidth (aim >= 0.8)
#   ctest.log    the CUDA kernel and tier tests (they compare every kernel with the CPU reference,
#                the fp8 page codec byte for byte, and the fp8 host tier on the copy streams)
#
# Machines without the Debian -dev packages kvtier builds against: run bench/gpu/fetch-debs.sh on a
# Debian 12 machine first (it puts the .deb files in .debs/ at the repository root, ~15 MiB) and
# take .debs/ along; they are unpacked into a private prefix that the build searches first.
# Nothing is installed system-wide. Checked in a minimal Debian 12 root holding only g++, CMake,
# ninja and the CUDA toolkit: configure and build of these targets succeed there.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
JOBS=${JOBS:-$(nproc)}
BUILD=${BUILD:-build-gpu}

if [ -d .debs ] && ls .debs/*.deb >/dev/null 2>&1; then
  prefix=$PWD/.debs/root
  mkdir -p "$prefix"
  for d in .debs/*.deb; do dpkg -x "$d" "$prefix"; done
  export CMAKE_PREFIX_PATH="$prefix/usr:${CMAKE_PREFIX_PATH:-}"
  export PKG_CONFIG_PATH="$prefix/usr/lib/x86_64-linux-gnu/pkgconfig:$prefix/usr/share/pkgconfig:${PKG_CONFIG_PATH:-}"
  export LD_LIBRARY_PATH="$prefix/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
  export CPATH="$prefix/usr/include:$prefix/usr/include/x86_64-linux-gnu:${CPATH:-}"
fi

status=0
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || echo "nvidia-smi failed (no driver?)" >> "$OUT/nvidia-smi.txt"

echo "== configure and build ($BUILD, CUDA on, sm_90)"
if ! cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVTIER_CUDA=ON \
      -DKVTIER_BUILD_PYTHON=OFF > "$OUT/configure.log" 2>&1; then
  tail -30 "$OUT/configure.log"; exit 1
fi
if ! cmake --build "$BUILD" -j "$JOBS" --target kvtier-bench kernels_cuda_test kernels_page_codec_test cuda_tier_test \
      transfer_engine_test > "$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log"; exit 1
fi

echo "== CUDA tests"
(cd "$BUILD" && ctest -L gpu --output-on-failure --timeout 300) > "$OUT/ctest.log" 2>&1 || status=1
"$BUILD"/tests/transfer_engine_test >> "$OUT/ctest.log" 2>&1 || status=1
grep -E "tests passed|tests failed|Passed|Failed|SKIPPED" "$OUT/ctest.log" | tail -5

echo "== transfer engine vs cudaMemcpyAsync"
"$BUILD"/bin/kvtier-bench io --gpu --json > "$OUT/tiers.json" 2> "$OUT/tiers.err" || status=1
cat "$OUT/tiers.json"

echo "== fp8 host tier: the codec kernels on the copy streams vs cudaMemcpyAsync of the bf16 pages"
"$BUILD"/bin/kvtier-bench io --gpu --json --set tiers.host.kv_dtype=fp8_e4m3 \
    --set tiers.nvme.kv_dtype=fp8_e4m3 > "$OUT/tiers_fp8.json" 2> "$OUT/tiers_fp8.err" || status=1
cat "$OUT/tiers_fp8.json"

echo "== decode attention vs device copy bandwidth"
"$BUILD"/bin/kvtier-bench attn --device cuda --json > "$OUT/attn.json" 2> "$OUT/attn.err" || status=1
cat "$OUT/attn.json"

exit $status
