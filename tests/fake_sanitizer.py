#!/usr/bin/env python3
"""A stand-in for compute-sanitizer in CPU tests: it runs no program but writes what a run would leave.

Environment: FAKE_SANITIZER_XML (a file whose text becomes the --save file; unset: none is written),
FAKE_SANITIZER_RECORD (JSON for the child's --record file; unset: none), FAKE_SANITIZER_STATUS (exit
status, default 0), FAKE_SANITIZER_SLEEP (seconds to hang first), FAKE_SANITIZER_ARGV (a file that gets
the command line, one argument per line, then this process's id).
"""

import os
import sys
import time

argv = sys.argv[1:]
if os.environ.get("FAKE_SANITIZER_ARGV"):
    with open(os.environ["FAKE_SANITIZER_ARGV"], "w") as f:
        f.write("\n".join([*argv, str(os.getpid())]))
time.sleep(float(os.environ.get("FAKE_SANITIZER_SLEEP", "0")))
if os.environ.get("FAKE_SANITIZER_XML"):
    with open(argv[argv.index("--save") + 1], "w") as out, open(os.environ["FAKE_SANITIZER_XML"]) as src:
        out.write(src.read())
if os.environ.get("FAKE_SANITIZER_RECORD"):
    with open(argv[argv.index("--record") + 1], "w") as out:
        out.write(os.environ["FAKE_SANITIZER_RECORD"])
print("========= COMPUTE-SANITIZER")
sys.exit(int(os.environ.get("FAKE_SANITIZER_STATUS", "0")))
