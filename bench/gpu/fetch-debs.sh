#!/usr/bin/env bash
# Downloads into .debs/ the Debian 12 packages that bench/gpu/check.sh needs to build kvtier on a
# GPU machine that has CUDA, a C++ compiler, CMake and ninja but none of kvtier's -dev libraries
# and no package registry. Run it here (a Debian 12 machine with apt), then carry .debs/ to the
# GPU machine beside the working tree; check.sh unpacks them into a private prefix and builds
# against it. Nothing is installed.
#
#   bench/gpu/fetch-debs.sh          # .debs/*.deb, about 15 MiB
#
# The list is what the build links or includes, with the shared libraries those need at link time
# that a CUDA image does not carry (checked in a minimal Debian 12 root with only g++, CMake and
# ninja added). Boost is headers only; of it the build uses Asio.
set -euo pipefail
cd "$(dirname "$0")/../.."
packages=(
  pkgconf pkgconf-bin libpkgconf3 pkg-config
  liburing-dev liburing2
  libhwloc-dev libhwloc15 libudev-dev libudev1 libnuma-dev libnuma1 libltdl-dev libltdl7
  libtbb-dev libtbb12 libtbbmalloc2 libtbbbind-2-5
  libboost1.74-dev libboost-dev
  libyaml-cpp-dev libyaml-cpp0.7
  prometheus-cpp-dev libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 libprometheus-cpp-push1.0
  libcivetweb-dev libcivetweb1 civetweb libcurl4-openssl-dev libcurl4 zlib1g-dev
  libxxhash-dev libxxhash0
  libgtest-dev libgmock-dev googletest
  libbenchmark-dev libbenchmark1debian
)
mkdir -p .debs
cd .debs
rm -f ./*.deb
apt-get download "${packages[@]}"
du -sh .
