"""Each chip's health story, as the healer writes it for `ix-device-plugin list` to show: a small JSON file beside
the front end's socket, replaced atomically whenever a story changes.

The file is the running agent's account; `list` (another process) reads it. A kubelet that starts again removes
plain files from its device-plugin directory, not directories: the file lives in a directory of its own.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ix_device_plugin.core.healing import HEALTHY, NEEDS_OPERATOR, OFF, OUT, RESETTING, WAITING, Care
from ix_device_plugin.settings.documents import DocumentError, read_file

STORY_FILE = "health.json"
STORY_LIMIT = 1024 * 1024
_PHASE_WORDS = {
    HEALTHY: "in service",
    OUT: "out of service until it clears",
    WAITING: "out of service, to be reset once free",
    RESETTING: "being reset",
    NEEDS_OPERATOR: "needs an operator",
    OFF: "out of service (self-healing off)",
}


def story_path(directory: Path) -> Path:
    """The story file in the front end's directory."""
    return directory / "ix-device-plugin" / STORY_FILE


def story_text(cares: Iterable[Care], healing: str, now: float) -> str:
    """The file's content: how self-healing stands, and every chip's story (now: monotonic; times written as Unix
    time)."""
    chips = [
        {
            "uuid": care.uuid,
            "minor": care.minor,
            "phase": care.phase,
            "causes": list(care.causes),
            "attempts": care.attempts,
            "note": care.note,
            "out_since": None if care.out_since is None else round(time.time() - (now - care.out_since), 1),
        }
        for care in sorted(cares, key=lambda care: (care.minor is None, care.minor or 0, care.uuid))
    ]
    return json.dumps({"written": time.time(), "self_healing": healing, "chips": chips}, indent=1) + "\n"


def read_story(path: Path) -> dict[str, Any] | None:
    """The story file's content, None when there is none or it cannot be read."""
    try:
        story = json.loads(read_file(path, STORY_LIMIT))
    except (OSError, DocumentError, ValueError):
        return None
    return story if isinstance(story, dict) and isinstance(story.get("chips"), list) else None


def story_line(chip: dict[str, Any]) -> str:
    """One chip's story as `list` shows it: where it stands, why, and the last step."""
    phase = str(chip.get("phase", ""))
    line = _PHASE_WORDS.get(phase, phase)
    causes = chip.get("causes") or []
    if causes and phase != HEALTHY:
        line += f": {', '.join(map(str, causes))}"
    if chip.get("note"):
        line += f"; {chip['note']}"
    return line
