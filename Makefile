# specmla: C library, header, install, and the binding tests (C, C++, Go, Node).
#
#   make lib                      release build of libspecmla.so (+ libspecmla.so.0 link)
#   make header                   regenerate include/specmla.h with cbindgen (a test checks drift)
#   make install PREFIX=/opt/x    lib + SONAME links + header + pkg-config file
#   make test-bindings            test-c (ASan/LSan/UBSan, soak) test-cpp test-go (-race) test-node
#
# Test models: models/draft as the target and models/draft-weak as the draft when they exist
# (swaps go to models/draft and back), else the random-weight golden models with token-id prompts.
# The expected greedy output comes from the Rust CLI (`specmla generate --json`) when it is
# available and the model has a tokenizer; each binding test reads it from SPECMLA_EXPECTED_JSON.

CARGO    ?= cargo
CC       ?= cc
PREFIX   ?= /usr/local
DESTDIR  ?=
VERSION  := 0.1.0
REL      := target/release
BUILD    := build
NODE_INC ?= $(shell dirname $$(dirname $$(command -v node)))/include/node
SAN      := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
CFLAGS_T := -std=gnu11 -O1 -g -Wall -Wextra -Werror -pthread -Iinclude -Itests/c
LDLIBS_T := -L$(REL) -lspecmla -Wl,-rpath,$(CURDIR)/$(REL)
MAX_TOKENS ?= 24
BUDGET   ?= 6

ifneq ($(wildcard models/draft/config.json),)
  SPECMLA_TARGET ?= $(CURDIR)/models/draft
  SPECMLA_DRAFT  ?= $(CURDIR)/models/draft-weak
  SPECMLA_DRAFT2 ?= $(CURDIR)/models/draft
  SPECMLA_PROMPT ?= $(shell head -n 1 models/workload/prompts.txt 2>/dev/null || echo '<bos>Q: Evaluate mod 10, starting from 0: a+9,b-7,c+5<think>')
  SPECMLA_PROMPT_IDS ?=
  SPECMLA_THINK_IDS ?=
  SPECMLA_SOAK_PROMPTS ?= $(wildcard $(CURDIR)/models/workload/prompts.txt)
else
  SPECMLA_TARGET ?= $(CURDIR)/models/golden/v3_yarn
  SPECMLA_DRAFT  ?= $(CURDIR)/models/golden/v3_bf16
  SPECMLA_DRAFT2 ?= $(CURDIR)/models/golden/v2_lite
  SPECMLA_PROMPT ?=
  SPECMLA_PROMPT_IDS ?= 5,17,42,7,99,3,1
  SPECMLA_THINK_IDS ?= 1,2
  SPECMLA_SOAK_PROMPTS ?=
endif
EXPECTED := $(CURDIR)/$(BUILD)/expected.json

# A target with an MTP layer for the MTP-drafter tests (the bundled target once its MTP shard is
# there; the golden v3_yarn fixture carries a random one).
ifneq ($(wildcard models/target/mtp.safetensors),)
  SPECMLA_MTP_TARGET ?= $(CURDIR)/models/target
else
  SPECMLA_MTP_TARGET ?= $(CURDIR)/models/golden/v3_yarn
endif
# A DeepSeek-V4 target for the sliding-window pool option (kv_window_blocks) tests.
SPECMLA_V4_TARGET ?= $(CURDIR)/models/golden/v4_mixed
export SPECMLA_TARGET SPECMLA_DRAFT SPECMLA_DRAFT2 SPECMLA_PROMPT SPECMLA_PROMPT_IDS SPECMLA_THINK_IDS SPECMLA_MTP_TARGET SPECMLA_V4_TARGET
export SPECMLA_SOAK_PROMPTS
export SPECMLA_MAX_TOKENS := $(MAX_TOKENS)
export SPECMLA_BUDGET := $(BUDGET)

.PHONY: lib header install test-c test-cpp test-go test-node test-bindings expected check-exports clean-bindings

lib:
	$(CARGO) build --release --lib
	ln -sf libspecmla.so $(REL)/libspecmla.so.0

$(REL)/libspecmla.so: lib

header:
	$(CARGO) test --test header_drift -- --ignored regenerate

install: lib
	install -d $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/lib/pkgconfig
	install -m 755 $(REL)/libspecmla.so $(DESTDIR)$(PREFIX)/lib/libspecmla.so.$(VERSION)
	ln -sf libspecmla.so.$(VERSION) $(DESTDIR)$(PREFIX)/lib/libspecmla.so.0
	ln -sf libspecmla.so.0 $(DESTDIR)$(PREFIX)/lib/libspecmla.so
	install -m 644 include/specmla.h $(DESTDIR)$(PREFIX)/include/specmla.h
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(VERSION)|' specmla.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/specmla.pc

# Expected greedy output from the Rust CLI (no draft, f32 KV like the ABI's default); no file when
# the CLI cannot produce one.
expected: lib
	@mkdir -p $(BUILD)
	@rm -f $(EXPECTED)
	@if [ -n "$$SPECMLA_PROMPT" ]; then set -- --prompt "$$SPECMLA_PROMPT"; else set -- --token-ids "$$SPECMLA_PROMPT_IDS"; fi; \
	if $(CARGO) build --release --bin specmla >/dev/null 2>&1 && $(REL)/specmla generate --help >/dev/null 2>&1; then \
	  $(REL)/specmla generate --model "$$SPECMLA_TARGET" "$$@" --kv-dtype f32 \
	    --max-tokens $(MAX_TOKENS) --json 2>/dev/null | head -n 1 > $(EXPECTED).tmp && \
	  grep -q token_ids $(EXPECTED).tmp && mv $(EXPECTED).tmp $(EXPECTED) || rm -f $(EXPECTED).tmp; \
	fi
	@if [ -f $(EXPECTED) ]; then echo "expected output ($(EXPECTED)): $$(cat $(EXPECTED) | head -c 300)"; \
	 else echo "expected output: none (the CLI did not build or run); comparing against spec-off runs only"; fi

expected_env = SPECMLA_EXPECTED_JSON=$$( [ -f $(EXPECTED) ] && echo $(EXPECTED) )

check-exports: lib
	@readelf -d $(REL)/libspecmla.so | grep -q 'SONAME.*libspecmla.so.0' || { echo "SONAME is not libspecmla.so.0"; exit 1; }
	@extra=$$(nm -D --defined-only $(REL)/libspecmla.so | awk '{print $$3}' | grep -v '^specmla_' || true); \
	 if [ -n "$$extra" ]; then echo "non-specmla_ exports: $$extra"; exit 1; fi
	@echo "exports: only specmla_* ($$(nm -D --defined-only $(REL)/libspecmla.so | grep -c ' specmla_')), SONAME libspecmla.so.0"

$(BUILD)/c/%: tests/c/%.c tests/c/common.h include/specmla.h lib
	@mkdir -p $(BUILD)/c
	$(CC) $(CFLAGS_T) $(SAN) $< -o $@ $(LDLIBS_T)

$(BUILD)/c/generate: examples/c/generate.c include/specmla.h lib
	@mkdir -p $(BUILD)/c
	$(CC) -std=gnu11 -O2 -Wall -Wextra -Werror -Iinclude $(SAN) $< -o $@ $(LDLIBS_T)

# test_soak: one engine from several threads for ~30 s (SPECMLA_SOAK_SECONDS=600 for a longer run).
# A small ASan quarantine (default 256 MB of freed blocks) so its RSS check measures the engine.
test-c: check-exports expected $(BUILD)/c/test_misuse $(BUILD)/c/test_generate $(BUILD)/c/test_threads $(BUILD)/c/generate \
  $(BUILD)/c/test_soak
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 $(BUILD)/c/test_misuse
	ASAN_OPTIONS=detect_leaks=1 $(expected_env) $(BUILD)/c/test_generate
	ASAN_OPTIONS=detect_leaks=1 $(BUILD)/c/test_threads
	ASAN_OPTIONS=detect_leaks=1 $(BUILD)/c/generate "$$SPECMLA_TARGET" "$$SPECMLA_DRAFT" \
	  "$${SPECMLA_PROMPT:-ids:$$SPECMLA_PROMPT_IDS}" $(MAX_TOKENS) $(BUDGET)
	ASAN_OPTIONS=detect_leaks=1:quarantine_size_mb=16 UBSAN_OPTIONS=print_stacktrace=1 $(BUILD)/c/test_soak

test-cpp: lib expected
	cmake -S bindings/cpp -B $(BUILD)/cpp -DCMAKE_BUILD_TYPE=Release -DSPECMLA_ROOT=$(CURDIR) >/dev/null
	cmake --build $(BUILD)/cpp -j2
	cd $(BUILD)/cpp && $(expected_env) ctest --output-on-failure

# Under the race detector (TestSoak drives one engine from many goroutines; the whole suite takes
# ~10 s with -race, the first run also builds the race runtime).
test-go: lib expected
	cd bindings/go && $(expected_env) go test -race -count=1 ./...
	cd bindings/go && go run ./examples/generate

NODE_ADDON := bindings/node/build/specmla.node
$(NODE_ADDON): bindings/node/src/addon.c include/specmla.h lib
	@mkdir -p bindings/node/build
	$(CC) -std=gnu11 -O2 -Wall -Wextra -fPIC -shared -I$(NODE_INC) -Iinclude $< -o $@ \
	  -L$(CURDIR)/$(REL) -lspecmla -Wl,-rpath,$(CURDIR)/$(REL)

test-node: $(NODE_ADDON) expected
	cd bindings/node && $(expected_env) node --test test/
	cd bindings/node && node examples/generate.js

test-bindings: test-c test-cpp test-go test-node

clean-bindings:
	rm -rf $(BUILD) bindings/node/build
