"""A stand-in server module for tests/inference/test_standby.py (no vLLM: the real one runs in tests/e2e/test_elastic.py):
run as __main__, it writes what it was given to the file named by its first argument, then exits."""

import json
import os
import sys

if __name__ == "__main__":
    out, *rest = sys.argv[1:]
    with open(out, "w") as f:
        json.dump({"argv": sys.argv, "rest": rest, "go_env": os.environ.get("AGRPO_STANDBY_GO")}, f)
