"""Device metadata (KEP-5304) on the real kubelet and containerd: each container reads its claims' metadata files
where Kubernetes 1.37 says they are, every attribute in them is the one of the device in the ResourceSlice the
scheduler allocated from, and the reference Go reader (k8s.io/dynamic-resource-allocation's devicemetadata, in the
build's `dra-metadata-check`) decodes every file, byte for byte as the reference writer would write it. The files
survive a driver restart unchanged and are gone once the claim is unprepared. And the standard attributes
`resource.kubernetes.io/numaNode` and `pciBusID`: stored by the API server, and the scheduler allocates a claim that
selects and lines up devices by NUMA node.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from harness.cluster import Cluster
from harness.dra import CHIPS, DRIVER, Driver, claim, node_slice
from harness.images import BUSYBOX_IMAGE
from harness.kube import Kubectl, Obj
from harness.pods import SHOW_DEVICES, STAY, shown_devices, wait_pod
from harness.waits import stays, until

CONTAINER_DIR = "/var/run/kubernetes.io/dra-device-attributes"
POD_CLAIM_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
SHARED = ("--splitboard", "true", "--replicas", "4")
NODE_ONLY = {"deviceNodes", "visibleDevices", "healthy", "shareID", "shares", "replicaDevices", "adminAccess"}
NUMA = "resource.kubernetes.io/numaNode"
BY_UUID = {chip.uuid: chip for chip in CHIPS}


def direct_path(claim_name: str, request: str) -> str:
    return f"{CONTAINER_DIR}/resourceclaims/{claim_name}/{request}/{DRIVER}-metadata.json"


def template_path(pod_claim: str, request: str) -> str:
    return f"{CONTAINER_DIR}/resourceclaimtemplates/{pod_claim}/{request}/{DRIVER}-metadata.json"


def reading(paths: list[str], pattern: str = "") -> str:
    """A shell script printing each file (the paths, and what the shell pattern finds) between markers, and
    whether the container may write it."""
    words = " ".join([*map(shlex.quote, paths), pattern])
    script = f'for f in {words}; do echo "BEGIN-FILE $f"; cat "$f"; echo END-FILE; '
    script += 'if (echo x >> "$f") 2>/dev/null; then echo "WRITABLE $f"; fi; done; '
    return SHOW_DEVICES + script + STAY


def pod(name: str, containers: list[tuple[str, list[dict[str, str]], list[str]]], claims: list[Obj]) -> Obj:
    """A pod of busybox containers (name, claim references, metadata files it prints)."""
    spec: Obj = {"restartPolicy": "Never", "terminationGracePeriodSeconds": 2, "resourceClaims": claims}
    spec["containers"] = [
        {"name": each, "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never", "command": ["sh", "-c", reading(paths)],
         "resources": {"claims": references}}
        for each, references, paths in containers
    ]  # fmt: skip
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def run(admin: Kubectl, namespace: str, manifest: Obj, driver: Driver) -> Obj:
    admin.create(manifest, "-n", namespace)
    name = manifest["metadata"]["name"]
    every = [c["name"] for c in manifest["spec"]["containers"]]

    def printed(current: Obj) -> bool:
        if current.get("status", {}).get("phase") != "Running":
            return False
        return all("END" in admin("logs", name, "-n", namespace, "-c", c, timeout=30) for c in every)

    return wait_pod(admin, namespace, name, printed, "every container printed its metadata", 120, [driver.log])


def files_read(output: str) -> dict[str, str]:
    """The files a container printed, by path; it fails when the container could write one."""
    assert "WRITABLE" not in output, f"a metadata file is writable in the container: {output}"
    found = re.findall(r"^BEGIN-FILE (\S+)\n(.*?)END-FILE$", output, re.S | re.M)
    return dict(found)


def decoded(cluster: Cluster, texts: list[str]) -> list[dict[str, Any]]:
    """What the reference Go reader decodes from each text (it fails a file it cannot decode, an invalid one, or
    one whose bytes the reference writer would not write)."""
    with tempfile.TemporaryDirectory() as directory:
        files = []
        for index, text in enumerate(texts):
            path = Path(directory) / f"{index}.json"
            path.write_text(text)
            files.append(str(path))
        done = subprocess.run(
            [str(cluster.binaries["dra-metadata-check"]), *files], capture_output=True, text=True, timeout=60
        )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def claim_dir(cluster: Cluster, uid: str) -> Path:
    """The driver's directory of the claim's metadata files on the node (by the claim's UID)."""
    return cluster.plugins_dir / DRIVER / "dra-device-metadata" / uid


def host_file(cluster: Cluster, uid: str, request: str) -> Path:
    return claim_dir(cluster, uid) / request / "metadata.json"


def check_file(
    cluster: Cluster, admin: Kubectl, namespace: str, text: str, claim_name: str, request: str, env: dict[str, str]
) -> dict[str, Any]:
    """The file of the claim's request matches the claim, its allocation and the slice; the decoded document."""
    (read,) = decoded(cluster, [text])
    assert read["versions"] == ["metadata.resource.k8s.io/v1beta1", "metadata.resource.k8s.io/v1alpha1"]
    document = read["metadata"]
    made = admin.get("resourceclaim", claim_name, namespace)
    assert (document["metadata"]["name"], document["metadata"]["uid"]) == (claim_name, made["metadata"]["uid"])
    assert document["metadata"]["generation"] >= 1
    assert document.get("podClaimName") == made["metadata"].get("annotations", {}).get(POD_CLAIM_ANNOTATION)
    results = [r for r in made["status"]["allocation"]["devices"]["results"] if r["request"].split("/")[0] == request]
    (entry,) = document["requests"]
    assert entry["name"] == results[0]["request"]
    assert [d["name"] for d in entry["devices"]] == [r["device"] for r in results]
    published = {d["name"]: d for d in node_slice(cluster)["spec"]["devices"]}
    for device, result in zip(entry["devices"], results, strict=True):
        assert (device["driver"], device["pool"]) == (DRIVER, result["pool"])
        attributes = device["attributes"]
        in_slice = published[device["name"]]["attributes"]
        assert {key: attributes[key] for key in in_slice} == in_slice, device["name"]
        assert set(attributes) - set(in_slice) <= NODE_ONLY
        chips = [BY_UUID[uuid] for uuid in attributes["visibleDevices"]["strings"]]
        assert attributes["deviceNodes"]["strings"] == [f"/dev/iluvatar{chip.minor}" for chip in chips]
        assert set(attributes["visibleDevices"]["strings"]) <= set(env["IX_VISIBLE_DEVICES"].split(","))
        assert attributes["healthy"] == {"bool": True}
        if "shareID" in result:
            assert attributes["shareID"] == {"string": result["shareID"]}
            assert attributes["shares"] == {"int": int(result["consumedCapacity"]["shares"])}
            assert set(attributes["replicaDevices"]["strings"]) <= set(env["IX_REPLICA_DEVICES"].split(","))
    assert host_file(cluster, made["metadata"]["uid"], request).read_text() == text  # the mount is the driver's file
    return document


def container_files(admin: Kubectl, namespace: str, pod_name: str, container: str) -> tuple[dict[str, str], dict]:
    output = admin("logs", pod_name, "-n", namespace, "-c", container)
    return files_read(output), shown_devices(output)[1]


def gone(cluster: Cluster, uid: str) -> bool:
    return not claim_dir(cluster, uid).exists()


def template(name: str, requests: list[Obj]) -> Obj:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": name},
            "spec": {"spec": {"devices": {"requests": requests}}}}  # fmt: skip


# ------------------------------------------------------------------ the scenarios


def test_a_direct_claim_survives_a_driver_restart_and_is_gone_after_unprepare(
    cluster: Cluster, admin: Kubectl, namespace: str, driver: Driver
) -> None:
    driver.configure()
    admin.create(claim("direct"), "-n", namespace)
    path = direct_path("direct", "gpu")
    manifest = pod("direct", [("main", [{"name": "gpu"}], [path])], [{"name": "gpu", "resourceClaimName": "direct"}])
    run(admin, namespace, manifest, driver)
    files, env = container_files(admin, namespace, "direct", "main")
    check_file(cluster, admin, namespace, files[path], "direct", "gpu", env)
    uid = admin.get("resourceclaim", "direct", namespace)["metadata"]["uid"]
    host = host_file(cluster, uid, "gpu")
    before = host.read_text()
    driver.stop()
    driver.start()  # the kubelet registers it again and prepares nothing new: the claim is in its checkpoint
    # the publisher's pod compares what the files say with what the node says now, and finds nothing to write
    stays(lambda: host.read_text() == before, 3, "the claim's metadata unchanged across the restart", [driver.log])
    assert admin("exec", "direct", "-n", namespace, "-c", "main", "--", "cat", path) == before
    (held,) = [BY_UUID[uuid] for uuid in env["IX_VISIBLE_DEVICES"].split(",")]
    driver.set_chips([replace(c, health=("OverTemp",)) if c == held else c for c in CHIPS])
    try:  # the running container sees the update: the file is rewritten in place, its bind mount kept

        def updated() -> dict[str, Any] | None:
            text = admin("exec", "direct", "-n", namespace, "-c", "main", "--", "cat", path)
            first, _ = json.JSONDecoder().raw_decode(text)
            return first if first["metadata"]["generation"] == 2 else None

        document = until(updated, 60, "the metadata's next generation in the container", [driver.log])
        assert document["requests"][0]["devices"][0]["attributes"]["healthy"] == {"bool": False}
    finally:
        driver.set_chips(CHIPS)
    admin.delete("pod", "direct", namespace)
    until(lambda: gone(cluster, uid), 60, "the claim's metadata removed", [driver.log])


def test_a_template_claim_is_found_by_its_pod_claim_name(
    cluster: Cluster, admin: Kubectl, namespace: str, driver: Driver
) -> None:
    driver.configure()
    admin.create(template("tpl", [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]), "-n", namespace)
    path = template_path("gpus", "gpu")
    claims = [{"name": "gpus", "resourceClaimTemplateName": "tpl"}]
    manifest = pod("tpl", [("main", [{"name": "gpus"}], [path])], claims)
    current = run(admin, namespace, manifest, driver)
    made = current["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    files, env = container_files(admin, namespace, "tpl", "main")
    document = check_file(cluster, admin, namespace, files[path], made, "gpu", env)
    assert document["podClaimName"] == "gpus"


def test_two_claims_in_one_container_each_have_their_file(
    cluster: Cluster, admin: Kubectl, namespace: str, driver: Driver
) -> None:
    driver.configure()
    admin.create([claim("first"), claim("second", count=2)], "-n", namespace)
    paths = [direct_path("first", "gpu"), direct_path("second", "gpu")]
    claims = [{"name": "a", "resourceClaimName": "first"}, {"name": "b", "resourceClaimName": "second"}]
    run(admin, namespace, pod("two", [("main", [{"name": "a"}, {"name": "b"}], paths)], claims), driver)
    files, env = container_files(admin, namespace, "two", "main")
    check_file(cluster, admin, namespace, files[paths[0]], "first", "gpu", env)
    second = check_file(cluster, admin, namespace, files[paths[1]], "second", "gpu", env)
    assert len(second["requests"][0]["devices"]) == 2


def test_a_first_available_request_is_filed_under_its_request(
    cluster: Cluster, admin: Kubectl, namespace: str, driver: Driver
) -> None:
    driver.configure()
    picked = claim("pick")
    subrequests = [
        {"name": f"sub-request-{index}", "deviceClassName": DRIVER, "allocationMode": "ExactCount", "count": count}
        for index, count in ((1, 5), (2, 2))
    ]
    picked["spec"]["devices"]["requests"] = [{"name": "request-1", "firstAvailable": subrequests}]
    admin.create(picked, "-n", namespace)
    path = direct_path("pick", "request-1")
    references = [{"name": "gpu", "request": "request-1"}]
    run(admin, namespace, pod("pick", [("main", references, [path])], [{"name": "gpu", "resourceClaimName": "pick"}]),
        driver)  # fmt: skip
    files, env = container_files(admin, namespace, "pick", "main")
    document = check_file(cluster, admin, namespace, files[path], "pick", "request-1", env)
    assert document["requests"][0]["name"] == "request-1/sub-request-2"


def test_a_share_says_its_share_id_and_amount(cluster: Cluster, admin: Kubectl, namespace: str, driver: Driver) -> None:
    driver.configure(flags=SHARED)
    try:
        admin.create(claim("share", shares=2), "-n", namespace)
        path = direct_path("share", "gpu")
        manifest = pod("share", [("main", [{"name": "gpu"}], [path])], [{"name": "gpu", "resourceClaimName": "share"}])
        run(admin, namespace, manifest, driver)
        files, env = container_files(admin, namespace, "share", "main")
        document = check_file(cluster, admin, namespace, files[path], "share", "gpu", env)
        attributes = document["requests"][0]["devices"][0]["attributes"]
        assert attributes["shares"] == {"int": 2} and len(attributes["replicaDevices"]["strings"]) == 2
        admin.delete("pod", "share", namespace)
        uid = document["metadata"]["uid"]
        until(lambda: gone(cluster, uid), 60, "the share's metadata removed", [driver.log])
    finally:
        driver.configure()


def test_an_admin_access_claim_says_so(cluster: Cluster, admin: Kubectl, namespace: str, driver: Driver) -> None:
    driver.configure()
    admin("label", "namespace", namespace, "resource.kubernetes.io/admin-access=true")
    admin.create(claim("monitor", admin_access=True), "-n", namespace)
    path = direct_path("monitor", "gpu")
    claims = [{"name": "gpu", "resourceClaimName": "monitor"}]
    run(admin, namespace, pod("monitor", [("main", [{"name": "gpu"}], [path])], claims), driver)
    files, env = container_files(admin, namespace, "monitor", "main")
    document = check_file(cluster, admin, namespace, files[path], "monitor", "gpu", env)
    assert document["requests"][0]["devices"][0]["attributes"]["adminAccess"] == {"bool": True}


def test_iluvatar_gpu_through_dra_has_its_metadata_under_the_generated_claim(
    cluster: Cluster, admin: Kubectl, namespace: str, driver: Driver, extended_class: Obj
) -> None:
    """The scheduler's claim for `iluvatar.com/gpu: 1` is made from no template: its file is under resourceclaims/,
    named by the claim the pod's status names."""
    driver.configure()
    manifest = pod("extended", [("main", [], [])], [])
    (main,) = manifest["spec"]["containers"]
    main["command"] = ["sh", "-c", reading([], f"{CONTAINER_DIR}/resourceclaims/*/*/{DRIVER}-metadata.json")]
    main["resources"] = {"limits": {"iluvatar.com/gpu": "1"}}
    del manifest["spec"]["resourceClaims"]
    current = run(admin, namespace, manifest, driver)
    made = current["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
    files, env = container_files(admin, namespace, "extended", "main")
    (path,) = files
    request = path.split("/")[-2]
    assert path == direct_path(made, request)
    check_file(cluster, admin, namespace, files[path], made, request, env)


@pytest.mark.parametrize("selector", ["numaNode", "matchAttribute"])
def test_the_standard_numa_node_is_stored_and_the_scheduler_allocates_by_it(
    cluster: Cluster, admin: Kubectl, namespace: str, driver: Driver, selector: str
) -> None:
    driver.configure()
    stored = {d["name"]: d["attributes"] for d in node_slice(cluster)["spec"]["devices"]}
    for chip in CHIPS:
        attributes = stored[f"gpu-{chip.minor}"]
        assert attributes[NUMA] == {"int": 0} and attributes["numaNode"] == {"int": 0}
        assert attributes["resource.kubernetes.io/pciBusID"] == {"string": f"0000:{0x8A + chip.minor:02x}:00.0"}
    if selector == "numaNode":
        made = claim("numa", selector='device.attributes["resource.kubernetes.io"].numaNode == 0')
    else:  # two requests lined up on one NUMA node, as a GPU and another driver's NIC would be
        made = claim("numa")
        (gpu,) = made["spec"]["devices"]["requests"]
        made["spec"]["devices"]["requests"] = [gpu, {**gpu, "name": "peer"}]
        made["spec"]["devices"]["constraints"] = [{"requests": ["gpu", "peer"], "matchAttribute": NUMA}]
    admin.create(made, "-n", namespace)
    manifest = pod("numa", [("main", [{"name": "gpu"}], [])], [{"name": "gpu", "resourceClaimName": "numa"}])
    run(admin, namespace, manifest, driver)
    results = admin.get("resourceclaim", "numa", namespace)["status"]["allocation"]["devices"]["results"]
    assert len(results) == (1 if selector == "numaNode" else 2)
