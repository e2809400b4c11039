"""A module for tests/unit/agent/test_warm.py to preload: it notes whether the garbage collector ran while it was
imported."""

import gc

COLLECTOR_ON_AT_IMPORT = gc.isenabled()
