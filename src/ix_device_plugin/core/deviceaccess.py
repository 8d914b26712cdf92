"""How this node's agent reaches the GPU device nodes, decided from what it was deployed with and what it finds.

The chart deploys the agent unprivileged, with the NRI injector sidecar giving its container the nodes (`nri`) or a
runtime that gives them itself (`runtime`), and, on nodes where neither works, a privileged DaemonSet of its own
(`privileged`) unless the operator forbade it (strict: then `none`). The decision is shown per node in the label
ACCESS_LABEL, which also moves the node between the two DaemonSets (docs/deployment.md, "Every cluster").
"""

from __future__ import annotations

from dataclasses import dataclass

from ix_device_plugin.settings.table import DEVICE_ACCESS_DEPLOYED, DEVICE_ACCESS_FALLBACKS

ACCESS_LABEL = "iluvatar.com/gpu.device-access"
NRI, RUNTIME, PRIVILEGED, NONE = "nri", "runtime", "privileged", "none"
DEPLOYED = DEVICE_ACCESS_DEPLOYED  # how a DaemonSet can give its container the nodes (IX_DEVICE_ACCESS)
ACCESS_VALUES = (*DEPLOYED, NONE)  # the label's values
FALLBACKS = DEVICE_ACCESS_FALLBACKS  # what a node whose unprivileged agent cannot open the nodes becomes
MISSING_REASON = "GPUDeviceAccessMissing"  # the Node Event's reason
# The first words of the NRI injector's status file (nri-injector/serve.go).
INJECTOR_REGISTERED, INJECTOR_UNAVAILABLE = "registered", "unavailable"


@dataclass(frozen=True)
class InjectorStatus:
    """What the NRI injector sidecar wrote: registered with the runtime's NRI, or why not."""

    registered: bool
    why: str = ""


@dataclass(frozen=True)
class Access:
    """This node's device access: the label's value, whether the GPUs are usable here, and the one line saying what
    is missing (empty when nothing is)."""

    value: str
    usable: bool
    missing: str = ""


def decide(deployed: str, fallback: str, open_problem: str | None, injector: InjectorStatus | None = None) -> Access:
    """The access of a container deployed as `deployed` (DEPLOYED), given why it cannot open the GPU device nodes
    (None: it can, or there are none) and, with `nri`, what the injector said (None: nothing readable).

    A container that cannot open them asks for `fallback`: `privileged` moves the node to the privileged DaemonSet,
    `none` (strict) leaves it without GPUs.
    """
    if open_problem is None:
        return Access(deployed, usable=True)
    why = _why(deployed, open_problem, injector)
    if deployed == PRIVILEGED:  # stays on its DaemonSet: another value would move the node back and forth
        return Access(PRIVILEGED, usable=False, missing=f"{why}; {_no_gpus(deployed)}")
    if fallback != PRIVILEGED:
        return Access(NONE, usable=False, missing=f"{why}; {_no_gpus(deployed)}")
    return Access(
        PRIVILEGED,
        usable=False,
        missing=f"{why}; the node moves to the privileged DaemonSet ({ACCESS_LABEL}={PRIVILEGED}; strict=true "
        "in the chart forbids it)",
    )


def _why(deployed: str, open_problem: str, injector: InjectorStatus | None) -> str:
    """What is missing, in the words of whoever knows best: the injector, else the failed open."""
    if deployed == NRI and injector is not None and not injector.registered and injector.why:
        return f"no GPU device nodes from the NRI injector: {injector.why}"
    if deployed == NRI and injector is None:
        return f"{open_problem} (the NRI injector left no status: is its sidecar in the pod?)"
    return open_problem


def _no_gpus(deployed: str) -> str:
    if deployed == PRIVILEGED:
        return "no GPUs on this node although the agent is privileged: is the Iluvatar driver loaded?"
    return "no GPUs on this node: strict mode forbids the privileged fallback (turn NRI on in the node's runtime)"


def parse_injector_status(text: str) -> InjectorStatus:
    """The injector's status file's text; ValueError naming what is wrong with it."""
    first = text.split("\n", 1)[0].strip()
    if first == INJECTOR_REGISTERED:
        return InjectorStatus(registered=True)
    word, colon, why = first.partition(":")
    if word == INJECTOR_UNAVAILABLE and colon:
        return InjectorStatus(registered=False, why=why.strip())
    quoted = repr(first)  # its escapes may make it longer than the text: cut what is shown, not what is read
    shown = quoted if len(quoted) <= 100 else f"{quoted[:100]}..."
    raise ValueError(f"{shown} is neither {INJECTOR_REGISTERED!r} nor {INJECTOR_UNAVAILABLE!r}: <why>")
