# The two commands of the README: `make demo` and `make test`. Both install missing Debian
# packages first (scripts/setup-deps.sh), then configure and build with CMake.
BUILD ?= build
JOBS ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: all deps build test demo asan tsan portable lint coverage fuzz bench clean

all: build

deps:
	@bash scripts/setup-deps.sh

# Quiet unless it fails: the build's output goes to a log that is printed only on failure.
build: deps
	@bash scripts/quiet.sh "configure" $(BUILD)/build.log cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release
	@bash scripts/quiet.sh "build" $(BUILD)/build.log cmake --build $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

demo: build
	@bash scripts/demo.sh $(BUILD)

# Unit and CLI tests under AddressSanitizer and UndefinedBehaviorSanitizer.
# Every unit test, every fuzz replay and the CLI tests of input handling (flags, files, bad
# input, resource limits, the server, two-party faults, chat, tokenizers) run here. The CLI tests
# listed in ASAN_SKIP run in `make test` only: they measure fidelity and output end to end on
# library paths the unit tests already run under the sanitizers (or, for layers and
# install_example, check sources and packaging, which no sanitizer sees), and they are half of
# this stage's CPU; without them CI keeps within its 15 minutes. One test more than cores
# overlaps the tests that wait on timeouts and sockets.
ASAN_SKIP = cli_recall cli_eval cli_eval_more cli_eval_types cli_mpc cli_mpc_mpcache \
  cli_mpcache cli_minicache cli_context_shift cli_kivi cli_pqcache cli_quant_fidelity \
  cli_golden_logits cli_upscale cli_opcount cli_bounded_memory cli_kquant_write cli_layersim \
  cli_serve_page layers cli_install_example
asan: deps
	cmake -S . -B $(BUILD)-asan -DCMAKE_BUILD_TYPE=Debug -DKVS_SANITIZE=ON >/dev/null
	cmake --build $(BUILD)-asan -j $(JOBS)
	cd $(BUILD)-asan && ctest --output-on-failure -j $$(($(JOBS) + 1)) \
	  -E '^($(subst $(space),|,$(strip $(ASAN_SKIP))))$$'

# Under ThreadSanitizer (-O1, a Debug build: KVS_ASSERT on) the tests whose code runs threads of
# its own: the thread pool; the products' work split; the parallel kernels with pools of 2 and 3
# threads (kvs_matmul's float and 8-bit paths, the integer K-quant kernels, the dequantising
# matmul, attention, KIVI, the forward pass); PQCache's clustering and cache worker and its slow
# tier; and the server's concurrent sessions (tests/cli/serve_concurrent.sh: 4 requests on 2
# sequences of 2 threads).
# The unit tests check fewer shapes there (KVS_UNDER_TSAN, tests/check.h). halt_on_error: the
# first report ends the program with a non-zero status, which fails its test.
TSAN_UNIT = test_threadpool test_worksplit test_kernels test_matmul_kq test_quant_types test_kv \
  test_kivi test_model test_pqcache test_pq_tier
TSAN_CLI = serve_concurrent
TSAN_REGEX = ^($(subst $(space),|,$(strip $(TSAN_UNIT) $(addprefix cli_,$(TSAN_CLI)))))$$
empty :=
space := $(empty) $(empty)
tsan: deps
	cmake -S . -B $(BUILD)-tsan -DCMAKE_BUILD_TYPE=Debug -DKVS_TSAN=ON >/dev/null
	cmake --build $(BUILD)-tsan -j $(JOBS) --target kvslim $(TSAN_UNIT)
	cd $(BUILD)-tsan && TSAN_OPTIONS=halt_on_error=1 ctest --output-on-failure -j $(JOBS) \
	  -R '$(TSAN_REGEX)'

# Static analysis: cppcheck on src/, tools/ and include/ (warnings, portability, performance;
# the build's configuration); any finding fails. Suppressions are justified where they are
# written (scripts/lint.sh, scripts/cppcheck-suppressions.txt).
# Without -march=native (KVS_NATIVE=OFF: no AVX2, the portable kernels) the kernel, attention and
# model tests against their references and golden logits: the SIMD paths are most of the kernel
# code, and a change that builds or works only with them (a name declared under #if KVS_AVX2, a
# scalar fallback left behind) shows here. -Werror as everywhere.
PORTABLE_TESTS = test_kernels test_matmul_kq test_quant_types test_kv test_model test_arch
portable: deps
	cmake -S . -B $(BUILD)-portable -DCMAKE_BUILD_TYPE=Release -DKVS_NATIVE=OFF >/dev/null
	cmake --build $(BUILD)-portable -j $(JOBS)
	cd $(BUILD)-portable && ctest --output-on-failure -j $(JOBS) \
	  -R '^($(subst $(space),|,$(strip $(PORTABLE_TESTS))))$$'

lint: deps
	JOBS=$(JOBS) bash scripts/lint.sh

# Line, function and branch coverage of src/ by the whole ctest suite (gcov + lcov), with a
# per-directory table and the kvs_fail( error paths no test reaches (scripts/coverage.sh).
# HTML report: $(BUILD)-coverage/coverage-html/index.html.
coverage: deps
	@bash scripts/quiet.sh "configure" $(BUILD)-coverage/build.log \
	  cmake -S . -B $(BUILD)-coverage -DCMAKE_BUILD_TYPE=Debug -DKVS_COVERAGE=ON
	@bash scripts/quiet.sh "build" $(BUILD)-coverage/build.log cmake --build $(BUILD)-coverage -j $(JOBS)
	bash scripts/coverage.sh $(BUILD)-coverage $(JOBS)

# libFuzzer harnesses (fuzz/, clang): build them in $(BUILD)-fuzz and run each for FUZZ_SECONDS
# (default 10) on a copy of its seed corpus; a crash fails and leaves its input there.
FUZZ_SECONDS ?= 10
fuzz: deps
	FUZZ_SECONDS=$(FUZZ_SECONDS) FUZZ_BUILD=$(BUILD)-fuzz JOBS=$(JOBS) bash scripts/fuzz.sh

bench: build
	bash bench/run_engine_bench.sh $(BUILD)

clean:
	rm -rf $(BUILD) $(BUILD)-asan $(BUILD)-tsan $(BUILD)-coverage $(BUILD)-fuzz
