"""Scheduling only: tests marked `heavy` (a minute or more on 2 cores) are collected first.

pytest-xdist hands tests to its workers in collection order, so a long test collected last
runs alone while the other worker idles; started first, the short tests fill in around them
and the workers finish together (longest-first scheduling). Nothing else depends on order."""


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: item.get_closest_marker("heavy") is None)  # stable
