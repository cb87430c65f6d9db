"""Test-suite settings. Scheduling: tests marked `heavy` (a minute or more on 2 cores) are
collected first.

pytest-xdist hands tests to its workers in collection order, so a long test collected last
runs alone while the other worker idles; started first, the short tests fill in around them
and the workers finish together (longest-first scheduling). Nothing else depends on order.
Threads: each xdist worker runs torch with its share of the cores (falsify/harness/threads.py).
Shrinking: see the end of this file."""

import atexit
import os
import shutil
import tempfile

from hypothesis import Phase, settings

# Caches derived from sources (falsify/harness/stamp_cache.py) go to a directory of this
# session, not the user's: the tests make hundreds of temporary projects. Set here, in the
# first process, so xdist workers and the commands tests run inherit the same one.
if "FALSIFY_CACHE_DIR" not in os.environ:
    os.environ["FALSIFY_CACHE_DIR"] = tempfile.mkdtemp(prefix="falsify-test-cache-")
    atexit.register(shutil.rmtree, os.environ["FALSIFY_CACHE_DIR"], True)


def pytest_configure(config):
    # each xdist worker its share of the cores for torch's threads (falsify/harness/threads.py);
    # set in the controller, before the workers start, so they inherit it
    from falsify.harness import threads

    if not hasattr(config, "workerinput"):
        threads.set_for_workers(getattr(config.option, "numprocesses", None) or 1)


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: item.get_closest_marker("heavy") is None)  # stable


# tests/test_third_party.py reruns the guide's `falsify run --bind` commands, whose kernels fail
# some checks on purpose, and compares outcomes only: which checks fail, each with its
# diagnosis, never the example printed. Under the Triton interpreter, shrinking one of those
# failures runs into hypothesis' 300-second shrink cap. That test sets this variable for its own
# subprocess, which then skips the shrink phase; whether a check fails does not depend on it.
if os.environ.get("FALSIFY_TEST_NO_SHRINK") == "1":
    settings.register_profile("falsify-test-no-shrink",
                              phases=[p for p in Phase if p is not Phase.shrink])
    settings.load_profile("falsify-test-no-shrink")
