"""Who wrote an annotation, read from metadata.managedFields: whatever another process wrote there is read without
error, and names an owner only where it has the API server's shape."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from ix_device_plugin.apiserver.managedfields import UNKNOWN, annotation_managers
from ix_device_plugin.apiserver.objects import pod_doc

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=30,
)
KEYS = st.text(max_size=40)


def entry(manager: Any, *keys: str) -> dict[str, Any]:
    fields = {"f:metadata": {"f:annotations": {".": {}, **{f"f:{key}": {} for key in keys}}}}
    return {"manager": manager, "operation": "Update", "apiVersion": "v1", "fieldsType": "FieldsV1", "fieldsV1": fields}


def test_each_annotation_is_owned_by_the_managers_whose_fields_name_it() -> None:
    metadata = {
        "managedFields": [
            entry("kubectl-create", "team", "predicate-time"),
            entry("vc-scheduler", "iluvatar.com/DevVolcano", "predicate-time"),  # co-owned: an apply, or a forgery
            {"manager": "kubelet", "fieldsV1": {"f:status": {"f:phase": {}}}, "subresource": "status"},
        ]
    }
    assert annotation_managers(metadata) == {
        "team": frozenset({"kubectl-create"}),
        "predicate-time": frozenset({"kubectl-create", "vc-scheduler"}),
        "iluvatar.com/DevVolcano": frozenset({"vc-scheduler"}),
    }


def test_an_entry_whose_manager_is_not_text_names_an_unknown_owner() -> None:
    assert annotation_managers({"managedFields": [entry(7, "a"), entry(None, "a")]}) == {"a": frozenset({UNKNOWN})}


def test_a_pod_doc_carries_who_wrote_its_annotations() -> None:
    pod = {"metadata": {"name": "p", "annotations": {"a": "1"}, "managedFields": [entry("vc-scheduler", "a")]}}
    assert pod_doc(pod).annotation_managers == {"a": frozenset({"vc-scheduler"})}


@given(JSON)
def test_any_metadata_at_all_is_read_without_error(metadata: Any) -> None:
    owners = annotation_managers(metadata)
    assert all(isinstance(key, str) and isinstance(managers, frozenset) for key, managers in owners.items())


@given(st.lists(JSON, max_size=5), st.lists(st.tuples(KEYS | st.integers(), KEYS), max_size=5))
def test_any_managed_fields_name_exactly_the_owners_of_entries_in_the_servers_shape(
    noise: list[Any], claims: list[tuple[Any, str]]
) -> None:
    """Entries of any shape mixed with well-formed ones: only the well-formed ones name owners, each exactly."""
    entries = [*noise, *(entry(manager, key) for manager, key in claims)]
    owners = annotation_managers({"managedFields": entries})
    for manager, key in claims:
        assert (manager if isinstance(manager, str) else UNKNOWN) in owners[key]
    claimed = {key for _, key in claims}
    for key in set(owners) - claimed:  # what noise names is only what has the shape f:metadata/f:annotations/f:<key>
        assert any(
            isinstance(item, dict)
            and isinstance(item.get("fieldsV1"), dict)
            and isinstance(item["fieldsV1"].get("f:metadata"), dict)
            and isinstance(item["fieldsV1"]["f:metadata"].get("f:annotations"), dict)
            and f"f:{key}" in item["fieldsV1"]["f:metadata"]["f:annotations"]
            for item in noise
        )


@given(JSON, st.dictionaries(KEYS, st.text(), max_size=5))
def test_a_pod_with_any_managed_fields_and_any_annotations_becomes_a_pod_doc(managed: Any, notes: dict) -> None:
    pod = pod_doc({"metadata": {"name": "p", "annotations": notes, "managedFields": managed}})
    assert pod.annotations == notes
