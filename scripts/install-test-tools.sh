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
# Idempotent: installs only what is missing; never fails the caller (it warns,
# and the tests that need a missing tool skip, naming it).

KOTLIN_COMPILER_VERSION="2.4.20"
TOOLS_PREFIX="${EDGEVIT_TOOLS_PREFIX:-$HOME/.cache/edgevit-test-tools}"

warn() { echo "install-test-tools: WARNING: $*" >&2; }
say() { echo "install-test-tools: $*"; }

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
if [ ${#apt_missing[@]} -eq 0 ]; then
    say "aapt2, android-framework-res, junit4 and a JDK already present"
elif ! command -v apt-get >/dev/null 2>&1; then
    warn "apt-get not available: not installing ${apt_missing[*]} (Android demo checks will skip)"
else
    say "apt-get install ${apt_missing[*]}"
    if ! { as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq \
           && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
                  "${apt_missing[@]}" >/dev/null; }; then
        warn "could not install ${apt_missing[*]} (not root, no sudo, or no package index): Android demo checks will skip"
    fi
fi

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
    say "npm install -g kotlin-compiler@$KOTLIN_COMPILER_VERSION"
    if ! npm install -g --no-fund --no-audit "kotlin-compiler@$KOTLIN_COMPILER_VERSION" >/dev/null 2>&1; then
        say "global npm install failed; installing into $TOOLS_PREFIX"
        mkdir -p "$TOOLS_PREFIX" && npm install --prefix "$TOOLS_PREFIX" --no-fund --no-audit \
            "kotlin-compiler@$KOTLIN_COMPILER_VERSION" >/dev/null 2>&1 \
            || warn "could not install kotlin-compiler: Kotlin compile checks will skip"
    fi
fi
exit 0
