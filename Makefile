# Everything a new machine needs, from the system Python, a C compiler and cmake.
# Each step is skipped when already done, so these targets are fast the second time.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: serve test test-fast lint bench pull postgres pgvector chromium llama-server litellm
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

# GPU=cuda|metal|vulkan rebuilds the engine with that ggml backend (its toolkit must be installed:
# CUDA's nvcc, Xcode on macOS, or the Vulkan SDK's headers and glslc); oars then offloads every layer.
GPU ?=
GPU_CMAKE_cuda := -DGGML_CUDA=on
GPU_CMAKE_metal := -DGGML_METAL=on
GPU_CMAKE_vulkan := -DGGML_VULKAN=on
LLAMA_CPP_PYTHON := llama-cpp-python==0.3.36
SERVE_STAMP := $(VENV)/.installed-serve$(if $(GPU),-$(GPU))

# SERVE_ARGS: flags for `oars serve` (e.g. SERVE_ARGS="--port 9000").
SERVE_ARGS ?=

serve: $(SERVE_STAMP)  ## set up, pull the default model on first use, serve on 127.0.0.1:8000
	$(BIN)/oars serve $(SERVE_ARGS)

$(VENV)/.installed-serve-%: $(VENV)/.installed-serve
	@test -n "$(GPU_CMAKE_$*)" || { echo "GPU=$* is not one of cuda, metal, vulkan"; exit 1; }
	CMAKE_ARGS="$(GPU_CMAKE_$*)" FORCE_CMAKE=1 $(BIN)/pip install -q --force-reinstall --no-deps \
		--no-binary llama-cpp-python --no-cache-dir '$(LLAMA_CPP_PYTHON)'
	rm -f $(VENV)/.installed-serve-*
	touch $@

test: $(VENV)/.installed-test clients/node_modules/.installed postgres chromium  ## set up and run the whole suite (lint, real model, real clients)
	$(BIN)/ruff check oars tests bench
	$(BIN)/ruff format --check oars tests bench
	$(BIN)/mypy oars tests
	$(BIN)/deptry .
	$(BIN)/oars pull
	$(BIN)/python -m pytest -q

test-fast: $(VENV)/.installed-test postgres  ## the fast tier: no model, seconds
	$(BIN)/python -m pytest -q -m "not model and not fuzz"

lint: $(VENV)/.installed-test
	$(BIN)/ruff check oars tests bench
	$(BIN)/ruff format --check oars tests bench
	$(BIN)/mypy oars tests
	$(BIN)/deptry .

# BENCH_ARGS: flags for `python -m bench.run` (e.g. BENCH_ARGS="--only foundation,gateway").
BENCH_ARGS ?=

bench: $(VENV)/.installed-test  ## the targets table, each figure against a reference run beside it (docs/benchmarks.md)
	$(BIN)/oars pull
	$(BIN)/python -m bench.run $(BENCH_ARGS)

pull: $(VENV)/.installed-serve
	$(BIN)/oars pull

# llama.cpp's own server, the reference of bench/vs_llama_server.py and of `make bench`'s
# llama-server targets, and its llama-bench, its own decode loop for a look beneath both (CI does
# not build them): from the llama.cpp vendored in the sdist of the llama-cpp-python that
# is installed, so all run the same kernels, and with the flags pip built that wheel with (Release,
# -march=native, OpenMP).
# No curl, no OpenSSL, no web UI: nothing is fetched at build time. About 7 minutes on 2 cores.
LLAMA_SERVER := build/llama-server

llama-server: | $(VENV)/.installed-serve  ## build $(LLAMA_SERVER)/bin/llama-server
	@command -v cmake >/dev/null && command -v g++ >/dev/null || { $(SUDO) apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends cmake g++; }
	@version=$$($(BIN)/pip show llama-cpp-python | sed -n 's/^Version: //p'); \
	if [ "$$(cat $(LLAMA_SERVER)/version 2>/dev/null)" = "$$version" ] && \
		[ -x $(LLAMA_SERVER)/bin/llama-bench ]; then exit 0; fi; \
	set -e; rm -rf $(LLAMA_SERVER); mkdir -p $(LLAMA_SERVER)/src; \
	$(BIN)/pip download -q --no-binary :all: --no-deps "llama-cpp-python==$$version" -d $(LLAMA_SERVER); \
	tar xzf $(LLAMA_SERVER)/llama_cpp_python-*.tar.gz -C $(LLAMA_SERVER)/src --strip-components=1; \
	cmake -S $(LLAMA_SERVER)/src/vendor/llama.cpp -B $(LLAMA_SERVER) -DCMAKE_BUILD_TYPE=Release \
		-DGGML_NATIVE=ON -DGGML_OPENMP=ON -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF \
		-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF; \
	cmake --build $(LLAMA_SERVER) --target llama-server llama-bench -j2; \
	echo "$$version" > $(LLAMA_SERVER)/version

# LiteLLM's proxy, the other gateway `bench.gateway_load --litellm` runs against the same upstream
# (CI does not install it): in a venv of its own, since oars does not depend on it and its pins are
# not ours. One version, pinned, so that runs compare; rebuilt only when the pin changes. Later
# releases' `proxy` extra pins companions (litellm-proxy, post-releases of litellm-enterprise and
# litellm-proxy-extras) that pip could not find when this was written.
LITELLM := build/litellm
LITELLM_VERSION := 1.106.12

litellm:  ## install LiteLLM's proxy into $(LITELLM)
	@if [ "$$(cat $(LITELLM)/version 2>/dev/null)" = "$(LITELLM_VERSION)" ]; then exit 0; fi; \
	set -e; rm -rf $(LITELLM); $(PY) -m venv $(LITELLM); \
	$(LITELLM)/bin/pip install -q --upgrade pip; \
	$(LITELLM)/bin/pip install -q 'litellm[proxy]==$(LITELLM_VERSION)'; \
	echo "$(LITELLM_VERSION)" > $(LITELLM)/version

# The store tests start throwaway PostgreSQL servers on loopback from Debian's packages, with
# pgvector (vector search in the database).
postgres:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { $(SUDO) apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends postgresql; }
	@$(MAKE) -s pgvector

# pgvector for the newest PostgreSQL installed: Debian's package where this release has one for
# that server; else built (about 10 s) from the source package of Debian's next release
# (PGVECTOR_SUITE), fetched through this machine's own Debian mirror into build/pgvector.
PGVECTOR_SUITE ?= trixie
PGVECTOR_SRC := build/pgvector

pgvector:
	@pg=$$(ls /usr/lib/postgresql | sort -n | tail -1); \
	[ -f /usr/share/postgresql/$$pg/extension/vector.control ] && exit 0; \
	set -e; export DEBIAN_FRONTEND=noninteractive; $(SUDO) apt-get update -q >/dev/null; \
	if [ -n "$$(apt-cache policy postgresql-$$pg-pgvector 2>/dev/null | grep -v '(none)' | grep Candidate)" ]; then \
		$(SUDO) apt-get install -y -q --no-install-recommends postgresql-$$pg-pgvector; exit 0; fi; \
	$(SUDO) apt-get install -y -q --no-install-recommends postgresql-server-dev-$$pg gcc make; \
	uri=$$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1); \
	[ -n "$$uri" ] || uri=$$(awk '$$1 == "deb" { print $$2; exit }' /etc/apt/sources.list); \
	rm -rf $(PGVECTOR_SRC); mkdir -p $(PGVECTOR_SRC)/apt/lists/partial; \
	printf 'Types: deb-src\nURIs: %s\nSuites: %s\nComponents: main\nSigned-By: %s\n' "$$uri" \
		$(PGVECTOR_SUITE) /usr/share/keyrings/debian-archive-keyring.gpg > $(PGVECTOR_SRC)/apt/next.sources; \
	apt="-o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts=$(CURDIR)/$(PGVECTOR_SRC)/apt \
		-o Dir::State::Lists=$(CURDIR)/$(PGVECTOR_SRC)/apt/lists"; \
	apt-get $$apt update -q >/dev/null; \
	(cd $(PGVECTOR_SRC) && apt-get $$apt source -q --download-only pgvector 2>/dev/null); \
	tar xzf $(PGVECTOR_SRC)/pgvector_*.orig.tar.gz -C $(PGVECTOR_SRC); \
	flags="PG_CONFIG=/usr/lib/postgresql/$$pg/bin/pg_config with_llvm=no OPTFLAGS="; \
	$(MAKE) -s -C $(PGVECTOR_SRC)/pgvector-* $$flags; \
	$(SUDO) $(MAKE) -s -C $(PGVECTOR_SRC)/pgvector-* $$flags install

# The playground test drives Debian's headless chromium through its chromedriver.
chromium:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || { $(SUDO) apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends chromium chromium-driver fonts-dejavu-core; }

# Real clients (npm packages) the suite drives; installed into clients/, nothing global.
clients/node_modules/.installed: clients/package.json clients/package-lock.json
	cd clients && npm ci --no-audit --no-fund --loglevel=error
	touch $@

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# llama-cpp-python builds from source the first time (about 5-7 minutes on 2 cores).
$(VENV)/.installed-serve: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[llama]'
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[llama,test]'
	touch $@
