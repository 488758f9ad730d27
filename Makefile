# augur — one Makefile (see ../shared/DESIGN.md, "Conventions").
#
#   make            build/augur, build/libaugur.a, build/libaugur.so and the examples
#   make examples   examples/*.c built against include/augur.h only, twice:
#                   build/examples/NAME (static) and build/examples/NAME-shared
#   make test       unit tests (cmocka) + end-to-end tests (pytest) on the fast models
#   make test-models  the slow suites on the big models (fetches them first)
#   make test-webui the chat page in headless Chromium (installs Chromium and Playwright first);
#                   its screenshot goes to build/test-artifacts/webui.png
#   make asan       the unit and e2e tests under ASan + UBSan (objects in build/asan)
#   make fuzz       libFuzzer targets in build/fuzz (clang)
#   make bench      benchmarks in build/bench (e.g. build/bench/quant_bench)
#   make bench-peer llama-cpp-python built for this CPU (the benchmarks' peer; bench/build_peer.sh)
#   make bench-spec speculative decoding vs llama.cpp prompt lookup (bench/spec_bench.py $(SPEC_ARGS))
#   make CUDA=1     ... with the CUDA backend (nvcc; --device cuda)
#   make gpu-test   on a GPU machine: build with CUDA=1 and run scripts/gpu_test.sh
#   make format     clang-format over the sources
#
# Sources are discovered: every .c under src/ except src/cli goes into the
# library; every tests/unit/test_*.c is one test program.

CC       ?= cc
BUILD    ?= build
OPT      ?= -O2 -g
SAN      ?=
CFLAGS_ALL := -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Wno-unused-parameter \
              -Isrc -Iinclude $(OPT) $(SAN) -MMD -MP -pthread $(CFLAGS)
LDLIBS_ALL := -lpcre2-8 -lutf8proc -lxxhash -ljansson -lmicrohttpd -lm -lpthread $(LDLIBS)

LIB_SRC  := $(shell find src -name '*.c' ! -path 'src/cli/*' | sort)
CLI_SRC  := $(sort $(wildcard src/cli/*.c))
TEST_SRC := $(sort $(wildcard tests/unit/test_*.c))
FUZZ_SRC := $(sort $(wildcard fuzz/fuzz_*.c))
BENCH_SRC := $(sort $(wildcard bench/*.c))

LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o)

# The CUDA backend (src/backend/cuda/*.cu): `make CUDA=1`, with nvcc on the
# PATH or under CUDA_HOME. Without it the backend is not built and
# --device cuda is a clear error.
comma     := ,
CUDA      ?= 0
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(shell command -v nvcc 2>/dev/null))
NVCC      ?= $(if $(CUDA_HOME),$(CUDA_HOME)/bin/nvcc,nvcc)
# sm_90a: Hopper's architecture-specific features (wgmma: attention_wg_k);
# a CUDA_ARCH without 90a builds the other kernels only
CUDA_ARCH ?= -gencode=arch=compute_90a,code=sm_90a
CU_SRC    := $(sort $(shell find src -name '*.cu'))
NVCCFLAGS := -std=c++17 -O3 $(CUDA_ARCH) $(if $(findstring 90a,$(CUDA_ARCH)),-DAUGUR_SM90A) -Isrc -Iinclude -DAUGUR_CUDA -Xcompiler -Wall,-fno-strict-aliasing \
             -lineinfo -MMD -MP
ifeq ($(CUDA),1)
CFLAGS_ALL += -DAUGUR_CUDA
LIB_OBJ    += $(CU_SRC:%.cu=$(BUILD)/%.o)
LDLIBS_ALL += $(if $(CUDA_HOME),-L$(CUDA_HOME)/lib64 -Wl$(comma)-rpath$(comma)$(CUDA_HOME)/lib64) -lcublas -lcudart -lstdc++
endif

# NCCL (tensor parallelism over the GPUs of one host, issue 49): nccl.h
# beside the CUDA toolkit or under NCCL_HOME. With NCCL=1, `make CUDA=1`
# builds the NCCL communicator (src/backend/cuda/comm_nccl.cu) and links
# libnccl. Opt-in until --tp runs on GPUs (the communicator is not yet
# wired into the model): linked by default it would make every CUDA binary
# need libnccl at run time for nothing. cuda-check compiles the file with
# NCCL wherever nccl.h is found, so it keeps building.
NCCL_HOME  ?= $(CUDA_HOME)
NCCL_FOUND := $(if $(wildcard $(NCCL_HOME)/include/nccl.h),1,0)
NCCL       ?= 0
ifeq ($(NCCL),1)
NVCCFLAGS += -DAUGUR_NCCL -I$(NCCL_HOME)/include
ifeq ($(CUDA),1)
CFLAGS_ALL += -DAUGUR_NCCL
LDLIBS_ALL += -L$(NCCL_HOME)/lib64 -Wl$(comma)-rpath$(comma)$(NCCL_HOME)/lib64 -lnccl
endif
endif
ifeq ($(NCCL)$(NCCL_FOUND),01)
CUDA_CHECK_NCCL := -DAUGUR_NCCL -I$(NCCL_HOME)/include
endif

# Objects depend on the configuration, so switching CUDA=0/1 (or flags)
# rebuilds what it changes.
CONFIG_STAMP := $(BUILD)/config.stamp
CONFIG_LINE  := $(CFLAGS_ALL) CUDA=$(CUDA) $(CUDA_ARCH)
$(shell mkdir -p $(BUILD) && (echo '$(CONFIG_LINE)' | cmp -s - $(CONFIG_STAMP) || echo '$(CONFIG_LINE)' > $(CONFIG_STAMP)))
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/%.o)
LIB      := $(BUILD)/libaugur.a

# The shared library: the same sources compiled again as position-independent
# code (the static library and the binary keep the faster non-PIC code), with
# only the augur_* API exported (src/api/augur.map). Its version is
# include/augur.h's AUGUR_VERSION; the soname carries the major version.
SO_VERSION := $(shell sed -n 's/^\#define AUGUR_VERSION "\(.*\)"/\1/p' include/augur.h)
SO_MAJOR := $(firstword $(subst ., ,$(SO_VERSION)))
PIC_OBJ  := $(LIB_SRC:%.c=$(BUILD)/pic/%.o) $(if $(filter 1,$(CUDA)),$(CU_SRC:%.cu=$(BUILD)/pic/%.o))
SO       := $(BUILD)/libaugur.so
SO_REAL  := $(BUILD)/libaugur.so.$(SO_VERSION)

EXAMPLE_SRC := $(sort $(wildcard examples/*.c))
EXAMPLES := $(EXAMPLE_SRC:examples/%.c=$(BUILD)/examples/%) $(EXAMPLE_SRC:examples/%.c=$(BUILD)/examples/%-shared)
# Examples see include/ only: they prove the public header is enough.
EXAMPLE_CFLAGS := -std=c11 -Wall -Wextra -Werror -pedantic -Iinclude $(OPT) $(SAN)
BIN      := $(BUILD)/augur
TEST_BIN := $(TEST_SRC:tests/unit/%.c=$(BUILD)/tests/%)

PYTEST   ?= python3 -m pytest
PYTEST_ARGS ?= -q

.PHONY: cuda-check cuda-emu gpu-test all test test-models test-webui unit e2e asan fuzz bench bench-peer bench-spec format clean examples
all: $(BIN) $(TEST_BIN) $(SO) examples

$(BUILD)/%.o: %.c $(CONFIG_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -c $< -o $@

$(BUILD)/%.o: %.cu $(CONFIG_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

# Compiles the CUDA sources without linking (`make test` does this when nvcc
# is installed, so they never rot on machines without a GPU).
# The sampling kernels' code (argmax, pick, candidates, and their split
# grids; the samplers' edits) and the few-row K-quant matmul (mmqv), the
# headers src/backend/cuda/sample_*.cuh and mmqv.cuh that sample.cu and
# mmq.cu include, run under a CPU emulation of a block (tests/emu/*_emu.cpp,
# which include the same headers) against the host's functions (mmqv:
# against mmq's arithmetic, bit for bit): for kernel edits without a GPU.
# EMU_DIMS: how many of its row sizes.
EMU_DIMS ?= 4
cuda-emu: $(BUILD)/emu/cands_emu $(BUILD)/emu/pick_emu $(BUILD)/emu/edit_emu $(BUILD)/emu/mmqv_emu $(BUILD)/emu/mamba_emu
	$(BUILD)/emu/cands_emu $(EMU_DIMS)
	$(BUILD)/emu/pick_emu $(EMU_DIMS)
	$(BUILD)/emu/edit_emu
	$(BUILD)/emu/mmqv_emu
	$(BUILD)/emu/mamba_emu
$(BUILD)/emu/argmax.o: src/base/argmax.c src/base/argmax.h
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O2 -Isrc -c $< -o $@
# (mamba_emu runs the CPU op beside the kernels: it links the library)
$(BUILD)/emu/mamba_emu: tests/emu/mamba_emu.cpp tests/emu/cuda_shim.h src/backend/cuda/mamba_kernels.cuh $(LIB)
	@mkdir -p $(dir $@)
	$(CXX) -std=c++17 -O2 -Isrc -Itests/emu -o $@ $< $(LIB) -lpthread -lm
$(BUILD)/emu/%_emu: tests/emu/%_emu.cpp tests/emu/cuda_shim.h $(wildcard src/backend/cuda/sample_*.cuh) src/backend/cuda/mmqv.cuh $(BUILD)/emu/argmax.o
	@mkdir -p $(dir $@)
	$(CXX) -std=c++17 -O2 -Isrc -Itests/emu -o $@ $< $(BUILD)/emu/argmax.o -lpthread -lm

cuda-check:
	@set -e; for f in $(CU_SRC); do echo "nvcc -c $$f"; $(NVCC) $(NVCCFLAGS) $(CUDA_CHECK_NCCL) -c $$f -o /dev/null; done

# On a GPU machine: build with CUDA=1 (build/cuda) and run the GPU tests.
gpu-test:
	scripts/gpu_test.sh

# webui.c embeds the files of webui/ with .incbin, which -MMD cannot see.
$(BUILD)/src/server/webui.o: $(wildcard webui/*)

$(LIB): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@
	ar rcs $@ $^

$(BUILD)/pic/%.o: %.cu $(CONFIG_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -Xcompiler -fPIC -c $< -o $@

$(BUILD)/pic/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -fPIC -c $< -o $@

$(SO_REAL): $(PIC_OBJ) src/api/augur.map
	$(CC) $(CFLAGS_ALL) -shared -Wl,-soname,libaugur.so.$(SO_MAJOR) -Wl,--version-script=src/api/augur.map \
	    -Wl,--no-undefined -o $@ $(PIC_OBJ) $(LDLIBS_ALL)

$(SO): $(SO_REAL)
	ln -sf $(notdir $(SO_REAL)) $(BUILD)/libaugur.so.$(SO_MAJOR)
	ln -sf $(notdir $(SO_REAL)) $@

examples: $(EXAMPLES)
$(BUILD)/examples/%-shared: examples/%.c include/augur.h $(SO)
	@mkdir -p $(dir $@)
	$(CC) $(EXAMPLE_CFLAGS) -o $@ $< -L$(BUILD) -laugur -Wl,-rpath,'$$ORIGIN/..'
$(BUILD)/examples/%: examples/%.c include/augur.h $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(EXAMPLE_CFLAGS) -o $@ $< $(LIB) $(LDLIBS_ALL)

$(BIN): $(CLI_OBJ) $(LIB)
	$(CC) $(CFLAGS_ALL) -o $@ $(CLI_OBJ) $(LIB) $(LDLIBS_ALL)

$(BUILD)/tests/%: tests/unit/%.c $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -Itests/unit -o $@ $< $(LIB) -lcmocka $(LDLIBS_ALL)

# Unit tests run from the repository root; they find shared data through
# AUGUR_SHARED (default ../shared).
unit: $(TEST_BIN)
	@set -e; for t in $(TEST_BIN); do echo "== $$t"; $$t; done

# (gen_model writes the random-weight models of the qwen3/qwen3moe parity tests)
e2e: $(BIN) $(SO) examples $(BUILD)/bench/gen_model
	AUGUR_BIN=$(abspath $(BIN)) AUGUR_GEN_MODEL=$(abspath $(BUILD)/bench/gen_model) $(PYTEST) $(PYTEST_ARGS) tests/py

test: unit e2e cuda-emu $(if $(shell command -v nvcc 2>/dev/null),cuda-check)

# The slow suites: parity and tokenizer checks on the bigger models (fetched here).
test-models: $(BIN)
	python3 scripts/fetch_models.py all
	AUGUR_BIN=$(abspath $(BIN)) $(PYTEST) $(PYTEST_ARGS) -m slow tests/py

# The chat page (webui/) in Debian's Chromium through Playwright; missing
# tools fail here instead of skipping.
test-webui: $(BIN)
	scripts/setup.sh --webui
	AUGUR_WEBUI_REQUIRED=1 AUGUR_BIN=$(abspath $(BIN)) $(PYTEST) $(PYTEST_ARGS) -m slow tests/py/test_webui_browser.py

asan:
	$(MAKE) BUILD=$(BUILD)/asan OPT="-O1 -g -fno-omit-frame-pointer" \
	    SAN="-fsanitize=address,undefined -fno-sanitize-recover=all" unit e2e

FUZZ_CFLAGS := -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Wno-unused-parameter -Isrc -Iinclude \
               -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -pthread
FUZZ_BIN := $(FUZZ_SRC:fuzz/%.c=$(BUILD)/fuzz/%)
fuzz: $(FUZZ_BIN)
$(BUILD)/fuzz/%: fuzz/%.c $(LIB_SRC)
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -o $@ $< $(LIB_SRC) $(LDLIBS_ALL)

BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)
bench: $(BENCH_BIN)
$(BUILD)/bench/%: bench/%.c $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -o $@ $< $(LIB) $(LDLIBS_ALL)

# The llama.cpp peer of bench/*.py, built for the CPU it runs on (skipped when
# the installed one already is); the flags used go to build/peer-build.txt.
bench-peer:
	bench/build_peer.sh

# e.g. make bench-spec SPEC_ARGS="-m models/SmolLM2-135M-Instruct.Q4_1.gguf -r 1 --sets chat"
SPEC_ARGS ?=
bench-spec: $(BIN)
	python3 bench/spec_bench.py $(SPEC_ARGS)

format:
	clang-format -i $$(find src tests/unit fuzz bench include -name '*.[ch]')

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
