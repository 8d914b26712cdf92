"""The reference reader of DRA device metadata (k8s.io/dynamic-resource-allocation's devicemetadata package),
through the end-to-end build's `dra-metadata-check`: decodes each file, validates it, and requires the bytes the
reference writer makes of what it decoded."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from helpers.host_tools import e2e_tool, require


def reference_reader() -> Path:
    """The dra-metadata-check binary ($IX_DRA_METADATA_CHECK names another); skips the test (fails it in CI)
    when it is not built."""
    binary = e2e_tool("dra-metadata-check", "IX_DRA_METADATA_CHECK")
    require(None if binary.is_file() else f"{binary} is not built: run `make e2e-build` (or e2e/cluster/build.sh)")
    return binary


def read_with_reference(binary: Path, files: Sequence[Path]) -> list[dict[str, Any]]:
    """What the reference reader decoded from each file (as v1beta1), with the API versions the file holds;
    the test fails with the reader's words when a file is not decoded, not valid, or not byte for byte."""
    done = subprocess.run([str(binary), *map(str, files)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]
