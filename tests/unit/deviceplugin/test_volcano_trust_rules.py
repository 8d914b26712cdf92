"""Volcano's choice believed only from Volcano: the pod asks for the resource on this node, and the API server records
Volcano's scheduler, alone, as the writer of each of its Volcano annotations."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from ix_device_plugin.apiserver.objects import ContainerLimits, PodDoc, pod_doc
from ix_device_plugin.deviceplugin.features.volcano import CHOICE_KEYS, DEV_VOLCANO, PREDICATE_TIME
from ix_device_plugin.deviceplugin.features.volcanotrust import (
    MESSAGE_LIMIT,
    REFUSED_REASON,
    Trust,
    asks_for,
    refusal_event,
)

NODE, RESOURCE, SCHEDULER = "gpu-node-1", "iluvatar.com/gpu", "vc-scheduler"
TRUST = Trust(NODE, RESOURCE, SCHEDULER)
CHOICE = {DEV_VOLCANO: "GPU-a", PREDICATE_TIME: "5"}
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=30,
)


def pod(writers: dict[str, set[str]] | None = None, **fields: Any) -> PodDoc:
    """A pod on NODE asking for one GPU, with Volcano's annotations written by writers (default the scheduler)."""
    writers = {key: {SCHEDULER} for key in CHOICE} if writers is None else writers
    managers = {key: frozenset(names) for key, names in writers.items()}
    limits = (ContainerLimits("main", {RESOURCE: "1"}),)
    base = PodDoc("ml", "p", "uid-p", dict(CHOICE), "Pending", NODE, None, limits, annotation_managers=managers)
    return replace(base, **fields)


def test_the_schedulers_own_writing_on_a_pod_asking_here_is_believed() -> None:
    assert TRUST.why_not(pod(), CHOICE_KEYS) is None


def test_a_key_another_manager_wrote_is_named_with_who_wrote_it() -> None:
    forged = pod({DEV_VOLCANO: {SCHEDULER}, PREDICATE_TIME: {"kubectl-annotate"}})
    assert TRUST.why_not(forged, CHOICE_KEYS) == (
        'its predicate-time annotation was written by "kubectl-annotate", not only by the scheduler ("vc-scheduler")'
    )
    both = pod({key: {"kubectl-edit"} for key in CHOICE})
    assert 'its iluvatar.com/DevVolcano and predicate-time annotations were written by "kubectl-edit"' in str(
        TRUST.why_not(both, CHOICE_KEYS)
    )


def test_a_key_shared_with_another_manager_or_written_by_none_recorded_is_not_believed() -> None:
    assert TRUST.why_not(pod({DEV_VOLCANO: {SCHEDULER, "kubectl-apply"}, PREDICATE_TIME: {SCHEDULER}}), CHOICE_KEYS)
    unrecorded = TRUST.why_not(pod({}), CHOICE_KEYS)
    assert unrecorded is not None and "written by no field manager the API server recorded" in unrecorded


def test_only_the_keys_asked_about_and_present_count() -> None:
    ours_now = pod({DEV_VOLCANO: {SCHEDULER}, PREDICATE_TIME: {"python-httpx"}})  # predicate-time taken by the plugin
    assert TRUST.why_not(ours_now, (DEV_VOLCANO,)) is None
    no_time = pod({DEV_VOLCANO: {SCHEDULER}}, annotations={DEV_VOLCANO: "GPU-a"})
    assert TRUST.why_not(no_time, CHOICE_KEYS) is None, "an absent predicate-time was forged by no one"


def test_a_pod_asking_for_no_gpu_or_bound_elsewhere_is_not_believed() -> None:
    assert TRUST.why_not(pod(containers=()), CHOICE_KEYS) == f"it asks for no {RESOURCE}"
    other = (ContainerLimits("main", {"example.com/fpga": "1", RESOURCE: "0"}),)
    assert TRUST.why_not(pod(containers=other), CHOICE_KEYS) == f"it asks for no {RESOURCE}"
    assert TRUST.why_not(pod(node_name="gpu-node-2"), CHOICE_KEYS) == f'it is bound to node "gpu-node-2", not {NODE}'


def test_limits_or_requests_of_containers_or_init_containers_ask() -> None:
    requested = (ContainerLimits("main", {}, {RESOURCE: "2"}),)
    assert asks_for(pod(containers=requested), RESOURCE)
    assert asks_for(pod(containers=(), init_containers=(ContainerLimits("init", {RESOURCE: "1"}),)), RESOURCE)
    parsed = pod_doc({"spec": {"initContainers": [{"name": "i", "resources": {"requests": {RESOURCE: 1}}}]}})
    assert asks_for(parsed, RESOURCE)


def test_the_refusal_is_a_warning_event_on_the_pod() -> None:
    event = refusal_event(pod(), NODE, "x" * 5000, "p.1", datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC))
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": "ml",
        "name": "p",
        "uid": "uid-p",
        "resourceVersion": "",
    }
    assert (event["type"], event["reason"], event["count"]) == ("Warning", REFUSED_REASON, 1)
    assert len(event["message"]) == MESSAGE_LIMIT and event["firstTimestamp"] == "2026-01-02T03:04:05Z"


@given(
    st.dictionaries(st.text(max_size=30), st.text(max_size=30), max_size=6),
    JSON,
    st.sampled_from([DEV_VOLCANO, PREDICATE_TIME]),
)
def test_any_annotations_and_managed_fields_are_judged_without_error_and_believed_only_from_the_scheduler(
    notes: dict[str, str], managed: Any, key: str
) -> None:
    obj = {
        "metadata": {"name": "p", "namespace": "ml", "uid": "u", "annotations": notes, "managedFields": managed},
        "spec": {"nodeName": NODE, "containers": [{"name": "main", "resources": {"limits": {RESOURCE: "1"}}}]},
    }
    parsed = pod_doc(obj)
    why = TRUST.why_not(parsed, (key,))
    believed = key not in notes or parsed.annotation_managers.get(key) == {SCHEDULER}
    assert (why is None) == believed
    if why is not None:
        assert len(why) < 2 * MESSAGE_LIMIT
