"""What every bench script needs before it imports the test harness: the repository root,
the build directory (`--build DIR` on the command line, else build/), CAF_HVD pointing into
it unless already set, and tests/cluster on the import path."""

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = sys.argv[sys.argv.index("--build") + 1] if "--build" in sys.argv[:-1] else \
    os.path.join(ROOT, "build")
os.environ.setdefault("CAF_HVD", os.path.join(BUILD, "apps", "caf-hvd"))
sys.path.insert(0, os.path.join(ROOT, "tests", "cluster"))


def named_build(spec):
    """argparse type of a NAME=PATH/TO/caf-hvd argument (scripts that compare builds)."""
    name, sep, path = spec.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"'{spec}': give NAME=PATH/TO/caf-hvd")
    return name, path
