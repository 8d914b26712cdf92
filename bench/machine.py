"""The machine and software the benchmarks ran on."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

import google.protobuf
import grpc

import ix_device_plugin


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def describe() -> dict[str, Any]:
    """CPU count and model, kernel, Python, grpcio, protobuf and plugin versions."""
    return {
        "cpus": os.cpu_count() or 0,
        "cpus_usable": len(os.sched_getaffinity(0)),
        "cpu_model": _cpu_model(),
        "architecture": platform.machine(),
        "system": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "grpcio": grpc.__version__,
        "protobuf": google.protobuf.__version__,
        "ix_device_plugin": ix_device_plugin.__version__,
    }
