"""How long a stop takes while a GPU reset runs, as the README states it and the code bounds it."""

from __future__ import annotations

import re
from pathlib import Path

from ix_device_plugin.gpureset.sequence import KILL_WAIT, RESET_STOP_WAIT
from ix_device_plugin.settings.options import NodeOptions

README = Path(__file__).resolve().parents[3] / "README.md"


def test_the_readme_states_the_stop_bound_while_ixsmi_runs() -> None:
    text = README.read_text()
    promise = " ".join(text[text.index("SIGTERM or SIGINT:") :].split("\n\n", 1)[0].split())
    assert "within 2 s whatever the plugin is doing" in promise and NodeOptions().stop_timeout <= 2
    waits = f"waits up to {RESET_STOP_WAIT:g} s more for it to end, then kills it (up to {KILL_WAIT:g} s more)"
    assert waits in promise
    found = re.search(r"at most about (\d+) s then", promise)
    assert found is not None and NodeOptions().stop_timeout + RESET_STOP_WAIT + KILL_WAIT <= float(found[1])
    assert 'A reset cut short by a stop is counted `result="cancelled"`, not `failed`' in promise
