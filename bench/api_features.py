"""What the API features cost a node that does not use them, and one that does: resident memory of the
plugin with per-node config, GPU reset and Volcano mode off, next to the same node with per-node config
and Volcano mode on against the API server stand-in (the client library is imported only then)."""

from __future__ import annotations

import asyncio
import shutil
from typing import Any

from bench import procfs
from bench.plugin import ONE_GPU, PluginProcess, short_dir
from bench.settings import Settings
from ix_device_plugin.standins.apiserver import ApiServerStandIn

NODE = "bench-node"
NAMESPACE = "kube-system"
CONNECTED_SECONDS = 3.0  # long enough for the node label watch and a Volcano pass


async def _rss(settings: Settings, args: tuple[str, ...] = (), env: dict[str, str] | None = None) -> dict[str, Any]:
    async with PluginProcess(ONE_GPU, extra_args=args, extra_env=env) as plugin:
        await plugin.launch()
        await asyncio.sleep(settings.settle_seconds + (CONNECTED_SECONDS if args else 0))
        return {"rss_mib": procfs.rss_mib(plugin.pid), "threads": procfs.threads(plugin.pid)}


async def run(settings: Settings) -> dict[str, Any]:
    """RSS with every API feature off, and with per-node config and Volcano mode on."""
    off = await _rss(settings)
    workdir = short_dir()
    try:
        async with ApiServerStandIn() as api:
            api.add_node(NODE)
            kubeconfig = api.write_kubeconfig(workdir / "kubeconfig", namespace=NAMESPACE)
            env = {"NODE_NAME": NODE, "POD_NAMESPACE": NAMESPACE, "KUBECONFIG": str(kubeconfig)}
            on = await _rss(settings, ("--per-node-config", "true", "--use-volcano", "true"), env)
            if api.get("configmaps", f"ix-device-info-cm-{NODE}", NAMESPACE) is None:
                raise RuntimeError("Volcano mode did not publish its ConfigMap: the API features were not on")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return {
        "off": off,
        "on": on,
        "rss_added_mib": round(on["rss_mib"] - off["rss_mib"], 2),
    }
