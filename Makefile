# kvtier — the README's two commands, on a fresh Debian 12 machine:
#   make run    install what is missing, build, run the main job (the long-context benchmark)
#   make test   install what is missing, build, run every test (ctest; slow runs excluded)
# Other targets: deps, build, asan, tsan, fuzz-short, fuzz-long, test-slow, install, clean.
SHELL := /bin/bash
.DEFAULT_GOAL := run

BUILD_DIR ?= build
JOBS ?= 2
BUILD_TYPE ?= RelWithDebInfo
CMAKE_ARGS ?=
FUZZ_SECONDS ?= 30

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
DEB_PACKAGES := build-essential cmake ninja-build pkg-config git \
  liburing-dev libhwloc-dev libtbb-dev libboost-dev libyaml-cpp-dev prometheus-cpp-dev \
  libxxhash-dev libgtest-dev libgmock-dev libbenchmark-dev \
  clang libclang-rt-14-dev fio gnuplot-nox prometheus \
  python3-dev python3-pip python3-venv pybind11-dev python3-numpy python3-pytest

.PHONY: deps configure build run test test-slow asan tsan fuzz-short fuzz-long install clean

# Installs only the packages dpkg reports absent, so a prepared machine does no apt work at all.
deps:
	@missing=""; \
	for p in $(DEB_PACKAGES); do \
	  dpkg -s "$$p" >/dev/null 2>&1 || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "kvtier: installing Debian packages:$$missing"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing; \
	fi

$(BUILD_DIR)/build.ninja:
	cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_ARGS)

configure: deps $(BUILD_DIR)/build.ninja

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

# The main job: the self-check of the embedded default config, then the long-context benchmark
# (about an hour of modeled traffic on an H200, all four baselines side by side).
run: build
	$(BUILD_DIR)/bin/kvtier-bench check
	$(BUILD_DIR)/bin/kvtier-bench run

test: build
	cd $(BUILD_DIR) && ctest -LE slow --output-on-failure -j $(JOBS) --timeout 600
	$(MAKE) --no-print-directory tsan
	$(MAKE) --no-print-directory fuzz-short

test-slow: build
	cd $(BUILD_DIR) && ctest -L slow --output-on-failure --timeout 3600

# ASan+UBSan build of everything, all fast tests.
asan: deps
	cmake --preset asan
	cmake --build --preset asan -j $(JOBS)
	ctest --preset asan -LE slow -j $(JOBS)

# TSan build of the concurrency stress tests only (labelled `stress`), part of `make test`.
tsan: deps
	cmake --preset tsan
	cmake --build --preset tsan -j $(JOBS) --target kvtier_stress_tests
	ctest --preset tsan -L stress

# Short libFuzzer runs of every fuzz target (KVTIER_FUZZ_SECONDS each), part of `make test`.
fuzz-short: deps
	cmake --preset fuzz
	cmake --build --preset fuzz -j $(JOBS) --target kvtier_fuzzers
	ctest --preset fuzz -L fuzz

# Long fuzzing runs: FUZZ_SECONDS per target (the short runs are ordinary ctest tests).
fuzz-long: deps
	cmake --preset fuzz
	cmake --build --preset fuzz -j $(JOBS) --target kvtier_fuzzers
	@for f in build-fuzz/bin/fuzz_*; do \
	  name=$${f##*/fuzz_}; work=build-fuzz/fuzz-corpus/$$name; mkdir -p $$work; \
	  echo "== $$f ($(FUZZ_SECONDS) s, corpus tests/fuzz/corpus/$$name)"; \
	  $$f -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 $$work tests/fuzz/corpus/$$name || exit 1; \
	done

install: build
	cmake --install $(BUILD_DIR)

clean:
	rm -rf $(BUILD_DIR) build-asan build-tsan build-fuzz
