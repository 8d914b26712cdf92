"""Device metadata (KEP-5304): what each container using a claim learns of its devices, from a file.

Pure: a prepared claim and what the node publishes in, paths and documents out; `metadatafiles.py` writes them.

Kubernetes 1.37 fixes where a container finds the file and what it holds (`k8s.io/dynamic-resource-allocation`
v0.37.2, `api/metadata`), and its kubelet-plugin helper how a driver writes it (`kubeletplugin/metadata.go`),
which this follows:

- in the container, one file per claim, request and driver:
  `/var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claim>/<request>/gpu.iluvatar.com-metadata.json`
  for a claim the pod names, `.../resourceclaimtemplates/<pod claim name>/<request>/...` for one made from a
  template (the claim's `resource.kubernetes.io/pod-claim-name` annotation); a request with `firstAvailable`
  is named without its subrequest, which the document names;
- on the host, `<driver dir>/dra-device-metadata/<claim UID>/<request>/metadata.json` (the helper files it by
  `<namespace>_<claim>`, which two claims of one name share and which a long name makes too long), bind-mounted
  read-only by a CDI device `gpu.iluvatar.com/metadata=<claim UID>_<request>` of a spec of its own
  (`gpu.iluvatar.com_metadata_<claim UID>_<request>.json`), given to the kubelet with the request's first device;
- the file: a `DeviceMetadata` object once per API version, newest first, each as Go's indented JSON encoder
  writes it and ended by a newline; `metadata.generation` is 1 when written first, one more at each change (the
  last one given is kept in the checkpoint, so that no number is given twice; see metadatafiles.py).

Each device carries the attributes the node publishes for it in its ResourceSlice (the same names and values),
and what only the node knows: the device nodes, the chips as IX_VISIBLE_DEVICES names them, the replica IDs of a
share as IX_REPLICA_DEVICES names them, its share ID and shares, whether it was given with admin access, and
whether it is healthy now.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any

from ix_device_plugin.core.cdi import minimum_version
from ix_device_plugin.dra.prepared import ClaimError, ClaimRef, PreparedClaim, PreparedDevice, base_request
from ix_device_plugin.dra.slices import DRIVER, MAX_ATTRIBUTE_LENGTH, SliceContent, SliceDevice, device_body

GROUP = "metadata.resource.k8s.io"
API_VERSIONS = (f"{GROUP}/v1beta1", f"{GROUP}/v1alpha1")  # newest first
KIND = "DeviceMetadata"
CONTAINER_DIR = PurePosixPath("/var/run/kubernetes.io/dra-device-attributes")
CLAIMS_DIR, TEMPLATES_DIR = "resourceclaims", "resourceclaimtemplates"
FILE_NAME = f"{DRIVER}-metadata.json"
HOST_DIR = "dra-device-metadata"
HOST_FILE = "metadata.json"
POD_CLAIM_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
CDI_KIND = f"{DRIVER}/metadata"
_CDI_FILE_PREFIX = f"{DRIVER}_metadata_"
MAX_ATTRIBUTES = 32  # per device, as the API's validation allows
MAX_GENERATION = 2**63 - 1  # what a reader's int64 holds
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
# What Go's encoder escapes beyond what Python's does (HTML-safe output, and the JavaScript line separators).
_GO_ESCAPES = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"})


@dataclass(frozen=True)
class NodeFacts:
    """What the node publishes of its devices now: the slice content and the PCIe roots of its chips; known is
    False before the first discovery, when they say nothing yet (a file written then keeps what it says)."""

    content: SliceContent = field(default_factory=lambda: SliceContent((), None))
    roots: Mapping[str, str] = field(default_factory=dict)
    known: bool = True


@dataclass(frozen=True)
class RequestFile:
    """One metadata file of a claim: the request it is named by, and the document without its generation."""

    request: str
    document: dict[str, Any]


def pod_claim_name(claim: Any, ref: ClaimRef) -> str | None:
    """The pod-local name of a claim made from a template (its annotation), None for a claim made on its own;
    ClaimError when the annotation is not a name that may name a directory."""
    metadata = claim.get("metadata") if isinstance(claim, dict) else None
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
    value = annotations.get(POD_CLAIM_ANNOTATION) if isinstance(annotations, dict) else None
    if value is None:
        return None
    if not isinstance(value, str) or not valid_label(value):
        raise ClaimError(f"claim {ref}: annotation {POD_CLAIM_ANNOTATION} {str(value)[:80]!r} is not a DNS label")
    return value


def valid_label(name: str) -> bool:
    """True for a DNS label: what a request or a pod claim name is, and what may name a directory."""
    return _DNS_LABEL.match(name) is not None


def check_request(ref: ClaimRef, request: str) -> None:
    """ClaimError for a request name that may not name a directory (the API server allows DNS labels only)."""
    if not valid_label(request):
        raise ClaimError(f"claim {ref}: request {request[:80]!r} is not a DNS label")


def container_path(ref: ClaimRef, pod_claim: str | None, request: str) -> str:
    """Where a container finds the file of the claim's request."""
    if pod_claim:
        return str(CONTAINER_DIR / TEMPLATES_DIR / pod_claim / request / FILE_NAME)
    return str(CONTAINER_DIR / CLAIMS_DIR / ref.name / request / FILE_NAME)


def claim_dir(root: Path, uid: str) -> Path:
    """The host directory of the claim's files, under the driver's directory root: named by the claim's UID, which
    no other claim has (a claim made again with the same name is another claim) and which always fits a name."""
    return root / HOST_DIR / uid


def host_path(root: Path, uid: str, request: str) -> Path:
    """The host file of the request of the claim uid."""
    return claim_dir(root, uid) / request / HOST_FILE


def named_claim_dir(root: Path, ref: ClaimRef) -> Path:
    """Where earlier versions of this driver filed a claim's files, by namespace and name (upstream's helper still
    does): looked at only to carry the file a running container holds over to claim_dir."""
    return root / HOST_DIR / f"{ref.namespace}_{ref.name}"


def is_named_dir(name: str) -> bool:
    """True for a directory of the layout by name (`<namespace>_<name>`: a UID never holds `_`)."""
    return "_" in name


def cdi_device(uid: str, request: str) -> str:
    """The CDI device that mounts the request's file."""
    return f"{uid}_{request}"


def cdi_id(uid: str, request: str) -> str:
    """The fully qualified CDI ID of the request's mount, as the kubelet is given it."""
    return f"{CDI_KIND}={cdi_device(uid, request)}"


def cdi_spec_file(uid: str, request: str) -> str:
    """The name of the CDI spec that mounts the request's file."""
    return f"{_CDI_FILE_PREFIX}{uid}_{request}.json"


def cdi_spec_uid(name: str) -> str | None:
    """The claim UID a metadata CDI spec's file name holds (a UID never holds `_`); None for another file."""
    if not (name.startswith(_CDI_FILE_PREFIX) and name.endswith(".json")):
        return None
    return name.removeprefix(_CDI_FILE_PREFIX).partition("_")[0]


def cdi_spec(claim: PreparedClaim, request: str, root: Path) -> dict[str, Any]:
    """The CDI spec that bind-mounts the request's file read-only where its containers look for it."""
    mount = {
        "hostPath": str(host_path(root, claim.ref.uid, request)),
        "containerPath": container_path(claim.ref, claim.pod_claim, request),
        "options": ["ro", "bind"],
    }
    device = {"name": cdi_device(claim.ref.uid, request), "containerEdits": {"mounts": [mount]}}
    spec: dict[str, Any] = {"cdiVersion": "", "kind": CDI_KIND, "devices": [device]}
    spec["cdiVersion"] = minimum_version(spec)
    return spec


def requests_of(devices: tuple[PreparedDevice, ...]) -> list[str]:
    """The requests a claim's devices answer for, as files are named (subrequests stripped), in order."""
    return list(dict.fromkeys(base_request(name) for device in devices for name in device.requests))


def with_mount_ids(ref: ClaimRef, devices: list[PreparedDevice]) -> list[PreparedDevice]:
    """devices with the metadata CDI ID of each request added to the first device answering for it (every
    container that references the request gets that device, so the mount)."""
    done: set[str] = set()
    changed = []
    for device in devices:
        ids = list(device.cdi_ids)
        for request in device.request_refs:
            if request not in done:
                done.add(request)
                ids.append(cdi_id(ref.uid, request))
        changed.append(device if len(ids) == len(device.cdi_ids) else replace(device, cdi_ids=tuple(ids)))
    return changed


def request_files(claim: PreparedClaim, facts: NodeFacts) -> list[RequestFile]:
    """The claim's metadata documents, one per request (generation left out: the writer sets it)."""
    by_request: dict[str, dict[str, list[PreparedDevice]]] = {}
    for device in claim.devices:
        for name in dict.fromkeys(device.requests):
            by_request.setdefault(base_request(name), {}).setdefault(name, []).append(device)
    published = facts.content.by_name()
    files = []
    for request, named in by_request.items():
        entries = [
            {"name": name, "devices": [_device(device, published.get(device.device), facts) for device in devices]}
            for name, devices in named.items()
        ]
        files.append(RequestFile(request, _document(claim, entries)))
    return files


def _document(claim: PreparedClaim, requests: list[dict[str, Any]]) -> dict[str, Any]:
    """The DeviceMetadata fields in the order Go writes them; generation is filled in by stream_text."""
    metadata = {"name": claim.ref.name, "namespace": claim.ref.namespace, "uid": claim.ref.uid, "generation": 0}
    document: dict[str, Any] = {"metadata": metadata}
    if claim.pod_claim is not None:
        document["podClaimName"] = claim.pod_claim
    document["requests"] = requests
    return document


def _device(prepared: PreparedDevice, published: SliceDevice | None, facts: NodeFacts) -> dict[str, Any]:
    """One device of a request: its slice attributes (where the node still has it) and what the node knows."""
    attributes: dict[str, dict[str, Any]] = {}
    if published is not None:
        attributes.update(device_body(published, facts.content.driver_version, facts.roots)["attributes"])
        nodes = [chip.device_node for chip in published.chips if chip.device_node]
        _add_strings(attributes, "deviceNodes", nodes)
        attributes["healthy"] = {"bool": published.healthy}
    _add_strings(attributes, "visibleDevices", list(prepared.chip_uuids))
    if prepared.share_id:
        attributes["shareID"] = {"string": prepared.share_id}
        attributes["shares"] = {"int": prepared.shares}
        _add_strings(attributes, "replicaDevices", list(prepared.replica_ids))
    if prepared.admin:
        attributes["adminAccess"] = {"bool": True}
    ordered = dict(sorted(attributes.items())[:MAX_ATTRIBUTES])  # Go writes a map's keys sorted
    entry: dict[str, Any] = {"driver": DRIVER, "pool": prepared.pool, "name": prepared.device}
    if ordered:
        entry["attributes"] = ordered
    return entry


def _add_strings(attributes: dict[str, dict[str, Any]], name: str, values: list[str]) -> None:
    """A list of strings, left out when empty or when one is longer than an attribute string may be."""
    if values and all(len(value) <= MAX_ATTRIBUTE_LENGTH for value in values):
        attributes[name] = {"strings": values}


def stream_text(document: Mapping[str, Any], generation: int) -> str:
    """The file's text: the document at generation in every API version, newest first, as Go writes them."""
    metadata = {**document["metadata"], "generation": generation}
    parts = []
    for version in API_VERSIONS:
        obj = {"kind": KIND, "apiVersion": version, **document, "metadata": metadata}
        parts.append(json.dumps(obj, indent=2, ensure_ascii=False).translate(_GO_ESCAPES) + "\n")
    return "".join(parts)


def uid_of(text: str) -> str | None:
    """The claim UID the first object of a metadata file's text names; None when it names none."""
    metadata = _first_metadata(text)
    uid = metadata.get("uid")
    return uid if isinstance(uid, str) else None


def generation_of(text: str) -> int | None:
    """The generation of the first object of a metadata file's text; None when it has none this driver wrote."""
    generation = _first_metadata(text).get("generation")
    if isinstance(generation, bool) or not isinstance(generation, int) or not 1 <= generation < MAX_GENERATION:
        return None
    return generation


def _first_metadata(text: str) -> dict[str, Any]:
    """The `metadata` object of the first object of a metadata file's text; empty when there is none."""
    try:
        first, _ = json.JSONDecoder().raw_decode(text)
    except (ValueError, RecursionError):
        return {}
    metadata = first.get("metadata") if isinstance(first, dict) else None
    return metadata if isinstance(metadata, dict) else {}
