"""An input for the reconcile loop: the value of one label of this node, from the Kubernetes API."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable

from ix_device_plugin.apiserver.connection import ApiConnection
from ix_device_plugin.apiserver.errors import KubeError
from ix_device_plugin.apiserver.settings import KubeConfigError
from ix_device_plugin.runtime.backoff import Backoff
from ix_device_plugin.runtime.logs import OncePerError

log = logging.getLogger(__name__)

HEALTHY_FOR = 30.0  # seconds a watch must have lasted for its failure to start the backoff again from the start
_UNSEEN = object()


class NodeLabelWatcher:
    """Follows one label of this node: its value at start, then every change, through API server outages."""

    def __init__(self, api: ApiConnection, label: str, backoff: Backoff | None = None) -> None:
        self.api = api
        self.node = api.node_name
        self.label = label
        self.backoff = backoff or api.backoff()
        self._errors = OncePerError(log, logging.WARNING)

    async def run(self, put: Callable[[str | None], None]) -> None:
        """put(value) with the label's value (None when absent) now and on each change; returns only by cancellation.

        When the API server is down or the node is missing, each distinct problem is logged once and the
        watch is tried again with backoff; the value is put again only when it differs from the last one put.
        """
        last: object = _UNSEEN
        while True:
            started = time.monotonic()
            try:
                kube = await self.api.kube()
                async with contextlib.aclosing(kube.watch_node(self.node)) as labels_seen:
                    async for labels in labels_seen:
                        self._errors.succeeded("watching label %s of node %s again", self.label, self.node)
                        value = labels.get(self.label)
                        if value != last:
                            last = value
                            put(value)
                problem = "the watch ended"
            except (KubeError, KubeConfigError) as error:
                problem = str(error)
            except Exception as error:  # a bug in a library must not stop the plugin: report it and go on
                problem = f"{type(error).__name__}: {error}"
            if time.monotonic() - started > HEALTHY_FOR:
                self.backoff.reset()
            self._errors.failed("label %s of node %s: %s; retrying", self.label, self.node, problem)
            await self.backoff.sleep()
