"""Metrics kept as plain numbers export exactly what prometheus_client's own metrics export."""

from __future__ import annotations

import re
import subprocess
import sys

import prometheus_client
import pytest

from ix_device_plugin.runtime import lazymetrics

BUCKETS = (0.001, 0.01, 0.1, 1.0)


def _exercise(module: object, registry: object) -> None:
    """The same metrics and updates, made with module's classes (prometheus_client's or ours)."""
    kinds: dict[str, type] = {name: getattr(module, name) for name in ("Counter", "Gauge", "Histogram", "Info")}
    info = kinds["Info"]("demo_build", "Build", registry=registry)
    info.info({"version": "1.2.3"})
    plain = kinds["Counter"]("demo_restarts", "Restarts", registry=registry)
    plain.inc()
    plain.inc(2)
    calls = kinds["Counter"]("demo_calls", "Calls", ["method"], registry=registry)
    calls.labels(method="Allocate").inc()
    calls.labels(method="List")
    kinds["Counter"]("demo_errors", "Errors", ["method", "code"], registry=registry)
    gauge = kinds["Gauge"]("demo_last_seconds", "Last", registry=registry)
    gauge.set(1234.5)
    latency = kinds["Histogram"]("demo_seconds", "Latency", ["method"], buckets=BUCKETS, registry=registry)
    for value in (0.0005, 0.001, 0.05, 0.5, 3.0):
        latency.labels(method="Allocate").observe(value)
    plain_histogram = kinds["Histogram"]("demo_wait_seconds", "Wait", buckets=BUCKETS, registry=registry)
    plain_histogram.observe(0.02)


def _without_created_values(text: bytes) -> str:
    return re.sub(r"(_created(\{[^}]*\})?) \S+", r"\1 T", text.decode())


def test_the_exposition_is_prometheus_clients_own() -> None:
    theirs = prometheus_client.CollectorRegistry(auto_describe=True)
    _exercise(prometheus_client, theirs)
    ours = lazymetrics.Registry()
    _exercise(lazymetrics, ours)
    assert _without_created_values(ours.render()) == _without_created_values(prometheus_client.generate_latest(theirs))
    assert ours.get_sample_value("demo_calls_total", {"method": "Allocate"}) == 1.0
    assert ours.get_sample_value("demo_seconds_bucket", {"method": "Allocate", "le": "0.01"}) == 2.0
    assert ours.get_sample_value("demo_calls_total", {"method": "Nope"}) is None


def test_created_series_follow_prometheus_clients_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROMETHEUS_DISABLE_CREATED_SERIES", "true")
    registry = lazymetrics.Registry()
    lazymetrics.Counter("demo_restarts", "Restarts", registry=registry).inc()
    assert b"_created" not in registry.render()


def test_wrong_labels_are_refused() -> None:
    calls = lazymetrics.Counter("demo_calls", "Calls", ["method"])
    with pytest.raises(ValueError, match="takes the labels method"):
        calls.labels(code="x")
    with pytest.raises(ValueError, match="has labels"):
        calls.inc()


def test_the_device_plugin_starts_without_prometheus_client() -> None:
    code = (
        "import sys, ix_device_plugin.cli, ix_device_plugin.deviceplugin.daemon; "
        "from ix_device_plugin.deviceplugin.metrics import Metrics; Metrics().observe_call('Allocate', 0.001, None); "
        "print(sorted(m for m in sys.modules if m.startswith(('prometheus_client', 'http.server', 'email'))))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]"
