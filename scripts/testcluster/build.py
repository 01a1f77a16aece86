#!/usr/bin/env python3
"""Build the pinned real-cluster test binaries; the checkout entry point.

Same as ``python -m spotwright.testing.build`` (see that module for the recipe and flags),
but runnable by any Python 3.11+ from a clone in which nothing is installed, so CI can
start the long build before (or without) creating the virtualenv. The build uses only the
standard library; to keep it that way whatever ``spotwright/__init__.py`` grows to import,
this script registers ``spotwright`` as a bare package and loads only ``spotwright.testing``.

Binaries land in ``$SPOTWRIGHT_TESTCLUSTER_CACHE`` or
``~/.cache/spotwright/testcluster/<version-key>/``, never in the work tree.
"""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path

package_dir = Path(__file__).resolve().parents[2] / "src" / "spotwright"
bare = types.ModuleType("spotwright")
bare.__path__ = [str(package_dir)]
sys.modules.setdefault("spotwright", bare)

if __name__ == "__main__":
    sys.exit(importlib.import_module("spotwright.testing.build").main())
