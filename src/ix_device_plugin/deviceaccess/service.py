"""This node's device access, shown where an operator looks: the Node's label, one Warning Event and a metric.

`check` decides once, at start, before the first discovery (the injector's status and an open of the device nodes);
`run` writes the label until it holds. Every pod of either mode checks and shows its own access: pods of one node share
its runtime, so they agree, and the label is written only where it differs.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from ix_device_plugin.core.deviceaccess import (
    ACCESS_LABEL,
    ACCESS_VALUES,
    MISSING_REASON,
    NRI,
    Access,
    InjectorStatus,
    decide,
)
from ix_device_plugin.deviceaccess.status import read_injector_status
from ix_device_plugin.hardware.devnodes import device_access_problem
from ix_device_plugin.runtime.lazymetrics import Gauge, Registry
from ix_device_plugin.runtime.logs import OncePerError
from ix_device_plugin.runtime.service import TaskFactory
from ix_device_plugin.settings.options import NodeOptions

if TYPE_CHECKING:
    from ix_device_plugin.apiserver.connection import ApiConnection
    from ix_device_plugin.healing.events import NodeEvents

log = logging.getLogger(__name__)

METRIC = "ix_device_plugin_device_access"


class DeviceAccessReport:
    """Decides this node's device access and shows it.

    api: the process's API connection (None: no label); events: the Node's Events (None: no Event).
    """

    def __init__(
        self, options: NodeOptions, api: ApiConnection | None, events: NodeEvents | None, registry: Registry
    ) -> None:
        self._options = options
        self._api = api if options.device_access_label else None
        self._events = events
        self._errors = OncePerError(log, logging.WARNING)
        self.access: Access | None = None
        self.gauge = Gauge(
            METRIC, "This node's device access (1 for the one in force): nri, runtime, privileged or none",
            ["access"], registry=registry,
        )  # fmt: skip

    @property
    def shown(self) -> bool:
        """True when this container was told how it is given the device nodes (the chart's DaemonSets say)."""
        return self._options.device_access is not None

    def check(self) -> Access | None:
        """Decide, log the one line saying what is missing, record the Event and set the metric; None when not
        shown. Reads files and opens device nodes: called once, before the first discovery."""
        deployed = self._options.device_access
        if deployed is None:
            return None
        injector = self._injector() if deployed == NRI else None
        access = decide(deployed, self._options.device_access_fallback, device_access_problem(self._options.dev_root),
                        injector)  # fmt: skip
        self.access = access
        for value in ACCESS_VALUES:
            self.gauge.labels(access=value).set(1.0 if value == access.value else 0.0)
        if access.missing:
            log.error("device access: %s", access.missing)
            if self._events is not None:
                self._events.record("Warning", MISSING_REASON, access.missing, key=MISSING_REASON)
        else:
            log.info("device access: %s (%s=%s)", _how(access.value), ACCESS_LABEL, access.value)
        return access

    def _injector(self) -> InjectorStatus | None:
        path = self._options.nri_status
        if path is None:
            return None
        status, why = read_injector_status(path)
        if status is None:
            log.warning("the NRI injector's status: %s", why)
        return status

    def tasks(self) -> dict[str, TaskFactory]:
        """The label's writer, where there is a label to write."""
        return {"device-access-label": self.run} if self.shown and self._api is not None else {}

    async def run(self) -> None:
        """Write the label until the Node has it (transient failures retried with backoff; a refusal said once), then
        stay, as the node's tasks do, until cancelled: the access of a running container does not change."""
        await self.label_node()
        await asyncio.Event().wait()

    async def label_node(self) -> None:
        """The label check() decided, written once the Node has it; returns at once without one to write, or after a
        refusal (said)."""
        access = self.access
        if access is None or self._api is None:
            return
        backoff = self._api.backoff()
        while True:
            try:
                await self._write(access.value)
            except Exception as error:  # the API server: tried again while it may succeed
                if not getattr(error, "transient", True):
                    log.error(
                        "cannot label node %s %s=%s: %s (the chart grants it with features.deviceAccessLabel)",
                        self._api.node_name, ACCESS_LABEL, access.value, error,
                    )  # fmt: skip
                    return
                self._errors.failed("labelling node %s: %s; retrying", self._api.node_name, error)
                await asyncio.sleep(backoff.next_delay())
            else:
                self._errors.succeeded()
                return

    async def _write(self, value: str) -> None:
        api = self._api
        assert api is not None
        kube = await api.kube()
        if (await kube.get_node(api.node_name)).get(ACCESS_LABEL) == value:
            return
        await kube.patch_node_labels(api.node_name, {ACCESS_LABEL: value})
        log.info("node %s labelled %s=%s", api.node_name, ACCESS_LABEL, value)


def _how(value: str) -> str:
    return {
        "nri": "the GPU device nodes come from the NRI injector; the agent runs unprivileged",
        "runtime": "the GPU device nodes come from the runtime; the agent runs unprivileged",
        "privileged": "the agent runs privileged",
    }.get(value, value)
