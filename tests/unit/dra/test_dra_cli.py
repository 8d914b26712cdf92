"""The CLI of the DRA driver: what `dra` needs to start, and `list` of its slice and prepared claims."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.dra_core import REF, allocated_claim, prepared_for

from ix_device_plugin.cli import main
from ix_device_plugin.dra.checkpoint import (
    checkpoint_text,
)


def test_dra_needs_a_node_name(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    assert main(["dra", "--backend", "simulated"]) == 2
    assert "dra needs the node name: give --node-name or NODE_NAME" in capsys.readouterr().err


def test_dra_without_api_server_settings_exits_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        monkeypatch.delenv(name, raising=False)
    assert main(["dra", "--backend", "simulated", "--node-name", "node-a"]) == 2
    assert "dra needs the Kubernetes API server" in capsys.readouterr().err


def test_list_dra_shows_the_slice_and_the_prepared_claims(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prepared = prepared_for(allocated_claim("gpu-1"))
    directory = tmp_path / "plugins" / "gpu.iluvatar.com"
    directory.mkdir(parents=True)
    (directory / "checkpoint.json").write_text(checkpoint_text({REF.uid: prepared}))
    argv = ["list", "--dra", "--backend", "simulated", "--node-name", "node-a", "--dev-root", str(tmp_path)]
    argv += ["--kubelet-plugins-directory-path", str(tmp_path / "plugins")]
    assert main([*argv, "--output", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["resourceSlice"] == "node-a-gpu.iluvatar.com"
    assert report["preparedClaims"]["uid-1"]["claim"] == "default/claim"
    assert report["preparedClaims"]["uid-1"]["devices"] == ["gpu-1"]
    assert [d["name"] for d in report["devices"]] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3", "board-0", "board-2"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "gpu-3: chip" in text and "board-2: board" in text and "default/claim (uid-1): gpu-1" in text
    assert "gpu-1: chip" in text and "held by default/claim" in text
