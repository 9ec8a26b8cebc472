# sluice: the two quick-start commands are `make demo` and `make test`.
BUILD      ?= build
BUILD_ASAN ?= build-asan
BUILD_FUZZ ?= build-fuzz
FUZZ_SECONDS ?= 60
GENERATOR  := $(shell command -v ninja >/dev/null 2>&1 && echo Ninja || echo "Unix Makefiles")
JOBS       ?= $(shell nproc)

.PHONY: all deps build demo test test-tools python-env test-asan fuzz format format-check bench clean

all: build

deps:
	@scripts/install-deps.sh

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -G "$(GENERATOR)" -DCMAKE_BUILD_TYPE=RelWithDebInfo

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

# Runs sluice's main job on the embedded default ($$SLUICE_HOME, by default ~/.sluice).
demo: build
	$(BUILD)/bin/sluice demo

test-tools:
	@scripts/install-test-tools.sh

# The project's .venv for the Python tests (torch, numpy, pytest, ...; reused when present).
python-env:
	@scripts/install-python.sh || echo "sluice: no .venv: the Python tests will SKIP (see the message above)" >&2

test: build test-tools python-env
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# Every test under AddressSanitizer and UndefinedBehaviorSanitizer (CI runs this).
test-asan: deps test-tools
	cmake -S . -B $(BUILD_ASAN) -G "$(GENERATOR)" -DCMAKE_BUILD_TYPE=Debug -DSLUICE_SANITIZE=ON
	cmake --build $(BUILD_ASAN) -j $(JOBS)
	cd $(BUILD_ASAN) && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --output-on-failure -j $(JOBS)

# Every parser under libFuzzer (clang, ASan, UBSan) for FUZZ_SECONDS each; fails on any
# finding (docs/testing.md, "Fuzzing"). CI runs it for 15 seconds each.
fuzz:
	BUILD_FUZZ=$(BUILD_FUZZ) JOBS=$(JOBS) scripts/fuzz.sh $(FUZZ_SECONDS)

format:
	clang-format -i $$(git ls-files '*.cc' '*.h')

format-check:
	clang-format --dry-run -Werror $$(git ls-files '*.cc' '*.h')

bench: build test-tools
	@scripts/install-deps.sh --bench
	bench/fio_compare.py
	bench/s3_compare.py
	bench/ckpt_compare.py
	bench/ledger_compare.py
	bench/doctor_compare.py

clean:
	rm -rf $(BUILD) $(BUILD_ASAN) $(BUILD_FUZZ)
