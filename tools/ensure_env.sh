#!/usr/bin/env bash
# Prints the python to use, setting up .venv first when no usable one exists.
# The current interpreter wins when torch, triton, pytest, xdist and hypothesis are all installed
# (the GPU machine has them and no network). Otherwise .venv is made with torch==2.13.0,
# which on a CPU-only machine is the CPU wheel, never a multi-GB CUDA build.
# Installed means found (importlib.util.find_spec), not imported: importing torch and triton takes
# seconds, which `specsan --help` and every usage error would pay before printing a line.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
need='import importlib.util, sys
sys.exit(not all(importlib.util.find_spec(m) for m in ("torch", "triton", "numpy", "pytest", "xdist", "hypothesis")))'
for py in "${PYTHON:-python3}" "$here/.venv/bin/python"; do
    if command -v "$py" >/dev/null 2>&1 && "$py" -c "$need" 2>/dev/null; then
        echo "$py"; exit 0
    fi
done
start=$(date +%s)
echo "specsan: setting up $here/.venv (first run only)" >&2
python3 -m venv "$here/.venv"
pip=("$here/.venv/bin/python" -m pip install -q --disable-pip-version-check)
"${pip[@]}" "torch==2.13.0" "triton==3.9.0"
"${pip[@]}" -r "$here/requirements-dev.txt"
"${pip[@]}" --no-deps -e "$here"  # the `specsan` command that repro lines name
echo "specsan: set-up took $(( $(date +%s) - start )) s" >&2
echo "$here/.venv/bin/python"
