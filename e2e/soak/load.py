"""The agent's API requests, counted from the API server's side: its audit log (JSON lines, one event per request;
the e2e cluster's policy records the agent's ServiceAccounts and the admin, harness/components.py).

Imports nothing of the agent (tests/unit/test_soak_schedule.py parses the imports).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from .checker import Request

AGENT_ACCOUNTS = (
    "system:serviceaccount:kube-system:iluvatar-device-plugin",
    "system:serviceaccount:kube-system:iluvatar-dra-driver",
)
# A host-process agent given the admin's certificate is told from the soak's and the tests' own requests (kubectl,
# Python's urllib) by its HTTP client's user agent.
AGENT_USER_AGENT = "python-httpx"
ADMIN = "ix-e2e-admin"  # the e2e cluster's admin certificate's CN


def agent_requests(path: Path, since: float, until: float | None = None) -> list[Request]:
    """The agent's requests the audit log at path recorded from `since` (epoch seconds) on, at times relative to it;
    a line that is not an audit event (a line cut short as the server stopped) is skipped."""
    if not path.exists():
        return []
    found = []
    with path.open(errors="replace") as lines:
        for line in lines:
            request = _request(line, since)
            if request is not None and request.at >= 0 and (until is None or request.at <= until - since):
                found.append(request)
    return sorted(found, key=lambda request: request.at)


def _request(line: str, since: float) -> Request | None:
    try:
        event = json.loads(line)
        user = str(event["user"]["username"])
        agent = str(event.get("userAgent", ""))
        received = datetime.fromisoformat(str(event["requestReceivedTimestamp"])).timestamp()
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    if user not in AGENT_ACCOUNTS and not (user == ADMIN and agent.startswith(AGENT_USER_AGENT)):
        return None
    return Request(received - since, str(event.get("verb", "")), str(event.get("requestURI", "")))
