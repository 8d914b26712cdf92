"""Each chip's health story, as the healer writes it for `ix-device-plugin list` to show.

A small JSON file beside the front end's socket, replaced atomically whenever a story changes.

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
from ix_device_plugin.settings.documents import DocumentError, Limits, load_json, read_file

STORY_FILE = "health.json"
STORY_LIMIT = 1024 * 1024
STORY_LIMITS = Limits(max_bytes=STORY_LIMIT, max_depth=8, max_values=100_000)
MAX_CHIPS = 1024  # more than any node has: the rest is not shown
MAX_CAUSES = 64
MAX_TEXT = 1024
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
    """The story file's content, None when there is none or it cannot be read.

    Any process that can write the plugin's directory can write this file: it is read under the bounds of every
    such document, and only what `list` shows is kept, each in the type it shows (a chip's texts as short texts).
    """
    try:
        story = load_json(read_file(path, STORY_LIMIT), STORY_LIMITS)
    except (OSError, DocumentError):
        return None
    if not isinstance(story, dict) or not isinstance(story.get("chips"), list):
        return None
    return {
        "written": _time(story.get("written")),
        "self_healing": _short(story.get("self_healing")),
        "chips": [_chip(chip) for chip in story["chips"][:MAX_CHIPS] if isinstance(chip, dict)],
    }


def _chip(chip: dict[str, Any]) -> dict[str, Any]:
    causes = chip.get("causes")
    return {
        "uuid": _short(chip.get("uuid")) or "",
        "minor": chip.get("minor") if isinstance(chip.get("minor"), int) else None,
        "phase": _short(chip.get("phase")) or "",
        "causes": [text for cause in causes[:MAX_CAUSES] if (text := _short(cause))]
        if isinstance(causes, list)
        else [],
        "attempts": chip.get("attempts") if isinstance(chip.get("attempts"), int) else 0,
        "note": _short(chip.get("note")) or "",
        "out_since": _time(chip.get("out_since")),
    }


def _time(value: Any) -> float | None:
    """value as a Unix time a clock can show (a number from 0 to year 5138); None for anything else."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1e11:
        return None
    return float(value)


def _short(value: Any) -> str | None:
    """value as a text of at most MAX_TEXT characters (a number or a boolean spelled out); None for none."""
    if value is None or isinstance(value, list | dict):
        return None
    return str(value)[:MAX_TEXT]


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
