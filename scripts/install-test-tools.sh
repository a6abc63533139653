#!/usr/bin/env bash
# Tools the test suite uses besides the Python packages in the [test] extra.
# Each is optional on a developer machine (its tests skip with a reason);
# CI installs them all.
set -uo pipefail
