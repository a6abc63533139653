#!/usr/bin/env bash
# Offline checks of the Android demo (no Android SDK needed): aapt2 link of the
# resources and manifest, kotlinc of every app source against API stubs, and
# the pure-Kotlin JUnit tests on the JVM. See offline_check.py.
set -euo pipefail
exec python3 "$(dirname "$0")/offline_check.py" "$@"
