# Thin wrapper over scripts/setup.sh, CMake presets and ctest. Every target installs what it
# needs first (setup is idempotent and fast when everything is present).
PRESET ?= default
BUILD_DIR := build/$(PRESET)
JOBS ?= 2
SCENARIOS ?= *
# Relative paths in ccache's hash, so fresh clones in other directories reuse the cache.
export CCACHE_BASEDIR := $(CURDIR)
export CCACHE_NOHASHDIR := 1

.PHONY: setup configure build test conform tsan lint clean

setup:
	bash scripts/setup.sh

configure: setup
	cmake --preset $(PRESET) >/dev/null

build: configure
	cmake --build --preset $(PRESET) -j $(JOBS)

# The test command (README, .ci/run): unit tests, conformance scenarios, layering check.
test: build
	bash scripts/check_layering.sh
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j $(JOBS)

# The main job: the conformance suite on the embedded default backend (threaded fake).
conform: build
	$(BUILD_DIR)/tools/fsdp-conform run '$(SCENARIOS)' --backend threaded

# The threaded process group and collectives (fakes_tests) and FSDP's multi-rank tests on them
# (fsdp_tests, engine/fsdp/*_test.cc) under ThreadSanitizer.
tsan: setup
	cmake --preset tsan >/dev/null
	cmake --build --preset tsan -j $(JOBS) --target fakes_tests fsdp_tests
	build/tsan/fakes/fakes_tests
	build/tsan/engine/fsdp_tests

# clang-tidy + cppcheck over the CUDA-path host code (no GPU needed).
lint: build
	bash scripts/lint_cuda_host.sh $(BUILD_DIR)

clean:
	rm -rf build
