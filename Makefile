# The two commands of the README, and the builds behind them.
#   make demo   install what is missing, build, run the main job on an embedded default
#   make test   install what is missing, build twice (release; clang with ASan+UBSan and
#               the fuzz targets) and run every test through CTest
#   make fuzz   (not part of make test) run every fuzz target for FUZZ_RUNS executions
JOBS ?= $(shell nproc)
FUZZ_SECONDS ?= 20
FUZZ_RUNS ?= 10000000
FUZZ_JOBS ?= 1
FUZZ_TARGETS := $(patsubst tests/fuzz/%.c,%,$(wildcard tests/fuzz/fuzz_*.c))

.PHONY: all build demo test test-release test-sanitize fuzz bench clean

all: build

build:
	scripts/deps.sh build
	cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
	cmake --build build -j $(JOBS)

demo: build
	scripts/demo.sh

test: test-release test-sanitize

test-release:
	scripts/deps.sh test
	cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DDLREC_WERROR=ON >/dev/null
	cmake --build build -j $(JOBS)
	cd build && ctest --output-on-failure -j $(JOBS)

# Sanitizers make every test slower; the fuzz targets need clang. The
# learning-quality tests (DLREC_TEST_RELEASE_ONLY) run in the release pass
# only, and a few sweeps there take part of their cases (docs/testing.md).
test-sanitize:
	scripts/deps.sh test
	CC=clang cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDLREC_WERROR=ON \
	  -DDLREC_SANITIZE=ON -DDLREC_FUZZ=ON -DDLREC_FUZZ_SECONDS=$(FUZZ_SECONDS) >/dev/null
	cmake --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  DLREC_TEST_RELEASE_ONLY=1 ctest --output-on-failure -j $(JOBS)

# Long fuzzing, by executions rather than seconds: every target, one at a
# time, from its seed corpus, with ASan + UBSan (tests/fuzz/run.sh says more).
fuzz:
	scripts/deps.sh test
	CC=clang cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDLREC_WERROR=ON \
	  -DDLREC_SANITIZE=ON -DDLREC_FUZZ=ON >/dev/null
	cmake --build build-asan -j $(JOBS) --target $(FUZZ_TARGETS)
	tests/fuzz/run.sh build-asan $(FUZZ_RUNS) $(FUZZ_JOBS)

bench: build
	scripts/deps.sh bench
	bench/run.sh

clean:
	rm -rf build build-asan
