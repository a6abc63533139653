#!/usr/bin/env bash
# Tools the test suite uses besides the Python packages in the [test] extra.
# Each is optional on a developer machine (its tests skip with a reason);
# CI installs them all.
set -uo pipefail

# Android demo offline checks (tests/test_android_demo.py):
#   kotlinc      npm package kotlin-compiler (ships kotlin-stdlib / kotlin-test jars)
#   aapt2        Debian package aapt
#   framework    Debian package android-framework-res (API 29 framework-res.apk)
#   JUnit 4      Debian package junit4 (+ hamcrest)
#   JDK          javac/java 17+ (Debian openjdk-17-jdk-headless) when missing
# GPU accelerator runs (tests/test_gpu_accelerator.py, every family export):
#   a software Vulkan device: SwiftShader, shipped in Debian's chromium
#   package, and the Vulkan loader (libvulkan1; chromium alone is not
#   enough). edgevit points VK_ICD_FILENAMES at
#   /usr/lib/chromium/vk_swiftshader_icd.json when it is unset. (Mesa's
#   lavapipe is refused by LiteRT's accelerator: "No adapters found".)
# The TFLite Task Library (tests/test_standard_clients.py): tflite-support 0.4.4
#   in its own virtual environment ($TOOLS_PREFIX/task-library: it pins
#   protobuf < 4, TensorFlow 2.21 needs newer); it loads only with Debian's
#   libusb-1.0-0. MediaPipe Tasks comes with the [test] extra.
# LiteRT's Arm64 kernels under emulation (tests/test_arm.py, `edgevit check --arm`):
#   scripts/install-arm-emulator.sh (qemu-user, an arm64 Python userland, the
#   ai-edge-litert 1.4.0 aarch64 wheel and the instruction-counting plugin in
#   ~/.cache/edgevit-arm).
# Idempotent: installs only what is missing; never fails the caller (it warns,
# and the tests that need a missing tool skip, naming it). Each step prints
# what it installs and where, a line every 30 s while it lasts, and its time.
# On a fresh Debian machine (2026-11-28): about 2.5 min with a fast mirror;
# about 850 MB: Debian packages 550 MB (chromium 350 MB of it), kotlin-compiler
# 94 MB (npm, global), the Task Library venv 280 MB and the Arm64 emulator
# 140 MB under ~/.cache, torch's CPU build and the converters' packages in the
# current Python environment.

KOTLIN_COMPILER_VERSION="2.4.20"
TOOLS_PREFIX="${EDGEVIT_TOOLS_PREFIX:-$HOME/.cache/edgevit-test-tools}"

warn() { echo "install-test-tools: WARNING: $*" >&2; }
say() { echo "install-test-tools: $*"; }
# run a step in the background: a line every 30 s while it lasts, its time when it ends
timed() {
    local what="$1" start=$SECONDS next=30 pid rc
    shift
    "$@" &
    pid=$!
    while kill -0 "$pid" 2>/dev/null; do
        sleep 1
        if (( SECONDS - start >= next )); then
            say "  ... $what: $((SECONDS - start)) s so far"
            next=$((next + 30))
        fi
    done
    wait "$pid"
    rc=$?
    say "  $what: $([ $rc -eq 0 ] && echo done || echo failed) in $((SECONDS - start)) s"
    return $rc
}

as_root() {
    if [ "$(id -u)" = "0" ]; then "$@"
    elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo "$@"
    else return 1
    fi
}

# --- Debian packages -------------------------------------------------------
apt_missing=()
command -v aapt2 >/dev/null 2>&1 || apt_missing+=(aapt)
[ -f /usr/share/android-framework-res/framework-res.apk ] || apt_missing+=(android-framework-res)
[ -f /usr/share/java/junit4.jar ] && [ -f /usr/share/java/hamcrest-core.jar ] || apt_missing+=(junit4)
command -v javac >/dev/null 2>&1 || apt_missing+=(openjdk-17-jdk-headless)
[ -f /usr/lib/chromium/vk_swiftshader_icd.json ] || apt_missing+=(chromium)
{ ldconfig -p 2>/dev/null | grep -q 'libvulkan\.so\.1'; } || apt_missing+=(libvulkan1)
{ ldconfig -p 2>/dev/null | grep -q 'libusb-1\.0\.so\.0'; } || apt_missing+=(libusb-1.0-0)
if [ ${#apt_missing[@]} -eq 0 ]; then
    say "aapt2, android-framework-res, junit4, a JDK and a software Vulkan device already present"
elif ! command -v apt-get >/dev/null 2>&1; then
    warn "apt-get not available: not installing ${apt_missing[*]} (Android demo checks and GPU runs will skip)"
else
    say "apt-get install ${apt_missing[*]} (Debian packages, system-wide: about 550 MB with chromium)"
    apt_install() {
        as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq \
            && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
                "${apt_missing[@]}" >/dev/null
    }
    if ! timed "apt-get" apt_install; then
        warn "could not install ${apt_missing[*]} (not root, no sudo, or no package index): Android demo checks and GPU runs will skip"
    fi
fi

# --- the TFLite Task Library (tflite-support), in its own venv ---------------
TASK_LIBRARY_VENV="$TOOLS_PREFIX/task-library"
if "$TASK_LIBRARY_VENV/bin/python" -c "from tflite_support.task import vision" >/dev/null 2>&1; then
    say "the Task Library (tflite-support) already present in $TASK_LIBRARY_VENV"
else
    say "pip install tflite-support==0.4.4 into its own venv, $TASK_LIBRARY_VENV (about 280 MB)"
    task_library() {
        python -m venv "$TASK_LIBRARY_VENV" \
            && "$TASK_LIBRARY_VENV/bin/python" -m pip install -q "tflite-support==0.4.4" "numpy<2" >/dev/null 2>&1
    }
    timed "tflite-support" task_library || warn "could not install tflite-support: the Task Library checks will skip"
fi

# --- LiteRT's Arm64 kernels under emulation ---------------------------------
timed "Arm64 emulator" bash "$(dirname "${BASH_SOURCE[0]}")/install-arm-emulator.sh" \
    || warn "could not install the Arm64 emulator: Arm64 checks will skip"

# --- kotlinc (npm) ---------------------------------------------------------
kotlinc_found() {
    local root
    [ -x "$TOOLS_PREFIX/node_modules/kotlin-compiler/bin/kotlinc" ] && return 0
    command -v npm >/dev/null 2>&1 || return 1
    root="$(npm root -g 2>/dev/null)" || return 1
    [ -n "$root" ] && [ -x "$root/kotlin-compiler/bin/kotlinc" ]
}
if kotlinc_found; then
    say "kotlinc (npm kotlin-compiler) already present"
elif ! command -v npm >/dev/null 2>&1; then
    warn "npm not available: not installing kotlin-compiler (Kotlin compile checks will skip)"
else
    say "npm install -g kotlin-compiler@$KOTLIN_COMPILER_VERSION (global npm package, about 94 MB)"
    if ! timed "kotlin-compiler" npm install -g --no-fund --no-audit "kotlin-compiler@$KOTLIN_COMPILER_VERSION" \
            >/dev/null 2>&1; then
        say "global npm install failed; installing into $TOOLS_PREFIX"
        mkdir -p "$TOOLS_PREFIX" && timed "kotlin-compiler" npm install --prefix "$TOOLS_PREFIX" --no-fund \
            --no-audit "kotlin-compiler@$KOTLIN_COMPILER_VERSION" >/dev/null 2>&1 \
            || warn "could not install kotlin-compiler: Kotlin compile checks will skip"
    fi
fi

# --- checkpoint import parity (tests/test_converters_*.py) ------------------
#   torch 2.13.0 CPU build (exact pin: a plain `pip install torch` could pull
#   a multi-GB CUDA build), timm and transformers without their optional
#   dependencies (torchvision has no wheel here; converters/parity.py stands
#   in for it, building models never runs it).
TORCH_VERSION="2.13.0"
py_has() { python -c "import $1" >/dev/null 2>&1; }
py_version() { python -c "import $1; print($1.__version__.split('+')[0])" 2>/dev/null; }
pip_has() { python -m pip show -q "$1" >/dev/null 2>&1; }  # timm's import needs torchvision
if [ "$(py_version torch)" = "$TORCH_VERSION" ]; then
    say "torch $TORCH_VERSION already present"
else
    say "pip install torch==$TORCH_VERSION (CPU build, into this Python environment)"
    torch_cpu() {
        python -m pip install -q "torch==$TORCH_VERSION" --index-url https://download.pytorch.org/whl/cpu \
                --extra-index-url https://pypi.org/simple >/dev/null 2>&1 \
            || python -m pip install -q "torch==$TORCH_VERSION" >/dev/null 2>&1
    }
    timed "torch" torch_cpu || warn "could not install torch $TORCH_VERSION: checkpoint parity tests will skip"
fi
py_missing=()
py_has safetensors || py_missing+=(safetensors)
py_has huggingface_hub || py_missing+=(huggingface_hub)
py_has yaml || py_missing+=(pyyaml)
py_has tokenizers || py_missing+=(tokenizers)
py_has regex || py_missing+=(regex)
if [ ${#py_missing[@]} -gt 0 ]; then
    say "pip install ${py_missing[*]} (into this Python environment)"
    timed "${py_missing[*]}" python -m pip install -q "${py_missing[@]}" >/dev/null 2>&1 \
        || warn "could not install ${py_missing[*]}"
fi
for pkg in timm transformers; do
    if pip_has "$pkg"; then
        say "$pkg already present"
    else
        say "pip install --no-deps $pkg (into this Python environment)"
        timed "$pkg" python -m pip install -q --no-deps "$pkg" >/dev/null 2>&1 \
            || warn "could not install $pkg: its parity tests will skip"
    fi
done
exit 0
