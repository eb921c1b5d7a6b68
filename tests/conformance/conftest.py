"""Markers of the conformance suite and its per-source count.

Every test module sets ``pytestmark = pytest.mark.source("<repository> <path>")``; a case of a
form cutegemm does not support carries ``pytest.mark.unsupported`` and asserts the clear error.
At the end of a run that collected conformance tests, a table counts per source: passed,
failed, skipped (the CUDA variants without a GPU) and, among the passed, the not-supported
cases (their error asserted)."""

from __future__ import annotations

import collections

import pytest

_RESULTS: dict = collections.defaultdict(collections.Counter)


def pytest_configure(config):
    config.addinivalue_line("markers", "source(name): the test file a conformance case is rewritten from")
    config.addinivalue_line("markers", "unsupported: a form cutegemm does not support: the clear error is asserted")


def _source(item) -> str | None:
    mark = item.get_closest_marker("source")
    return mark.args[0] if mark else None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    source = _source(item)
    if source is None:
        return
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        kind = report.outcome
        if kind == "passed" and item.get_closest_marker("unsupported"):
            kind = "not supported (error asserted)"
        _RESULTS[source][kind] += 1


def pytest_terminal_summary(terminalreporter):
    if not _RESULTS:
        return
    kinds = ("passed", "not supported (error asserted)", "failed", "skipped")
    terminalreporter.write_sep("=", "conformance per source")
    for source in sorted(_RESULTS):
        counts = _RESULTS[source]
        row = ", ".join(f"{counts[k]} {k}" for k in kinds if counts[k])
        terminalreporter.write_line(f"{source}: {row}")
