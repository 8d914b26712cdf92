"""The reset handshake's document as another process may write it: hostile ones are refused, naming where."""

from __future__ import annotations

import time

import pytest

from ix_device_plugin.gpureset.sequence import GpuResetError, ResetInfo

NODE = "gpu-node-1"
WHERE = "ConfigMap kube-system/ix-gpu-reset-gpu-node-1"


def alias_bomb() -> str:
    """About 400 bytes that a plain YAML loader turns into 10**9 references (and str() into gigabytes)."""
    lines = ["a: &a [x,x,x,x,x,x,x,x,x,x]"]
    lines += [f"{b}: &{b} [{','.join([f'*{a}'] * 10)}]" for a, b in zip("abcdefgh", "bcdefghi", strict=True)]
    lines.append("nodename: *i")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (alias_bomb(), "anchors and aliases are not allowed here"),
        ("occupy: " + "[" * 3000 + "]" * 3000, "nested more than 32 levels deep"),
        ("reset: 'false'\n", "reset must be true or false, not 'false'"),
        ("x" * 70_000, "more than the 65,536 allowed"),
    ],
    ids=["alias-bomb", "deeply-nested", "reset-a-string", "too-large"],
)
def test_a_hostile_document_is_refused_quickly_naming_the_config_map_and_key(text: str, problem: str) -> None:
    assert len(alias_bomb()) < 400
    started = time.monotonic()
    with pytest.raises(GpuResetError) as refused:
        ResetInfo.parse(text, NODE, WHERE)
    # A hang guard, not a speed check (the refusal takes milliseconds; the bench measures it): a bomb that were
    # expanded would take minutes, while a loaded machine took 2.9 s for the deeply nested one.
    assert time.monotonic() - started < 15
    message = str(refused.value)
    assert message.startswith(f"{WHERE} key gpuReset") and problem in message, message
    assert "cannot reach" not in message
