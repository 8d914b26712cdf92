"""Our agents' API server traffic as the API server's audit log records it (the agents' group only, metadata).

A request is counted once: a watch when its response starts, anything else when it completes; by the time the
API server received it. Writes are create, update, patch, delete and deletecollection, server-side dry runs
apart (they are answered and never stored).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

WRITES = frozenset({"create", "update", "patch", "delete", "deletecollection"})


@dataclass(frozen=True)
class Request:
    """One audited request of an agent."""

    received: float  # unix seconds
    user: str
    verb: str
    resource: str
    code: int
    ended: float | None  # a watch: when it ended (None: still open); anything else: when it completed
    dry_run: bool = False  # a server-side dry run: answered, never stored

    @property
    def write(self) -> bool:
        """A request that changes what etcd stores."""
        return self.verb in WRITES and not self.dry_run

    @property
    def what(self) -> str:
        """verb and resource, as the tables show them."""
        return f"{'dry-run ' if self.dry_run else ''}{self.verb} {self.resource}"


def _seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def _resource(event: dict[str, Any]) -> str:
    ref = event.get("objectRef") or {}
    resource = ref.get("resource", "")
    return f"{resource}/{ref['subresource']}" if ref.get("subresource") else resource


def read_audit(path: Path) -> list[Request]:
    """Every agent request in the audit log at path."""
    import json

    started: dict[str, dict[str, Any]] = {}
    completed: dict[str, dict[str, Any]] = {}
    with path.open() as lines:
        for line in lines:
            event = json.loads(line)
            if event.get("stage") == "ResponseStarted":
                started[event["auditID"]] = event
            elif event.get("stage") in ("ResponseComplete", "Panic"):
                completed[event["auditID"]] = event
    requests = []
    for audit_id in started.keys() | completed.keys():
        first = started.get(audit_id) or completed[audit_id]
        last = completed.get(audit_id)
        requests.append(
            Request(
                received=_seconds(first["requestReceivedTimestamp"]),
                user=first["user"]["username"],
                verb=first["verb"],
                resource=_resource(first),
                code=int(((last or first).get("responseStatus") or {}).get("code", 0)),
                ended=_seconds(last["stageTimestamp"]) if last is not None else None,
                dry_run="dryRun=All" in first.get("requestURI", ""),
            )
        )
    return sorted(requests, key=lambda request: request.received)


def window(requests: list[Request], start: float, end: float) -> list[Request]:
    """The requests received in [start, end)."""
    return [request for request in requests if start <= request.received < end]


def watches_open(requests: list[Request], at: float) -> int:
    """Watches started before `at` and not ended by then."""
    return sum(
        1
        for request in requests
        if request.verb == "watch" and request.received < at and (request.ended is None or request.ended > at)
    )


def summary(requests: list[Request], nodes: int, seconds: float) -> dict[str, Any]:
    """Per node and per second figures of a window's requests, by verb and resource."""
    writes = [request for request in requests if request.write]
    by_verb = Counter(request.verb for request in requests)
    by_resource = Counter(request.what for request in requests)
    errors = Counter(str(request.code) for request in requests if request.code >= 400)
    return {
        "seconds": round(seconds, 2),
        "requests": len(requests),
        "writes": len(writes),
        "requests_per_node": round(len(requests) / nodes, 2),
        "writes_per_node": round(len(writes) / nodes, 2),
        "requests_per_second": round(len(requests) / seconds, 2) if seconds > 0 else None,
        "by_verb": dict(sorted(by_verb.items())),
        "by_resource": dict(sorted(by_resource.items())),
        "errors": dict(sorted(errors.items())),
    }
