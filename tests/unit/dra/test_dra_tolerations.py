"""A claim's device tolerations: read strictly from its allocation results, matched to taints as Kubernetes does."""

from __future__ import annotations

from typing import Any

import pytest

from ix_device_plugin.dra.prepared import ClaimError
from ix_device_plugin.dra.slices import HEALING_TAINT, UNHEALTHY_TAINT
from ix_device_plugin.dra.tolerations import Toleration, read_tolerations, taint_text, untolerated

SICK = {"key": UNHEALTHY_TAINT, "value": "XID-64", "effect": "NoSchedule"}
HEALING = {"key": HEALING_TAINT, "value": "needs-operator", "effect": "NoSchedule"}
BARE = {"key": UNHEALTHY_TAINT, "effect": "NoSchedule"}  # a taint without a value


def toleration(**fields: Any) -> Toleration:
    (read,) = read_tolerations([fields], "here")
    return read


@pytest.mark.parametrize(
    ("fields", "taint", "tolerated"),
    [
        ({"operator": "Exists"}, SICK, True),  # empty key with Exists: every taint
        ({"operator": "Exists"}, HEALING, True),
        ({"key": UNHEALTHY_TAINT, "operator": "Exists"}, SICK, True),  # any value of that key
        ({"key": UNHEALTHY_TAINT, "operator": "Exists"}, HEALING, False),  # another key
        ({"key": UNHEALTHY_TAINT, "operator": "Equal", "value": "XID-64"}, SICK, True),
        ({"key": UNHEALTHY_TAINT, "value": "XID-64"}, SICK, True),  # the operator defaults to Equal
        ({"key": UNHEALTHY_TAINT, "operator": "", "value": "XID-64"}, SICK, True),
        ({"key": UNHEALTHY_TAINT, "value": "XID-46"}, SICK, False),  # Equal compares the value
        ({"key": UNHEALTHY_TAINT}, SICK, False),  # Equal to no value
        ({"key": UNHEALTHY_TAINT}, BARE, True),  # which is what a taint without a value has
        ({"key": UNHEALTHY_TAINT, "operator": "Exists", "effect": "NoSchedule"}, SICK, True),
        ({"key": UNHEALTHY_TAINT, "operator": "Exists", "effect": "NoExecute"}, SICK, False),  # another effect
        ({"key": UNHEALTHY_TAINT, "operator": "Exists", "effect": ""}, SICK, True),  # empty: every effect
        ({"operator": "Exists", "effect": "NoExecute"}, SICK, False),
        ({"key": UNHEALTHY_TAINT, "operator": "Lt", "value": "XID-64"}, SICK, False),  # unknown: tolerates nothing
        ({"key": UNHEALTHY_TAINT, "operator": "Exists", "tolerationSeconds": 30}, SICK, True),
    ],
)
def test_a_toleration_tolerates_a_taint_as_kubernetes_matches_them(
    fields: dict[str, Any], taint: dict[str, str], tolerated: bool
) -> None:
    assert toleration(**fields).tolerates(taint) is tolerated


def test_every_taint_needs_a_toleration_of_its_own_kind() -> None:
    key_only = [toleration(key=UNHEALTHY_TAINT, operator="Exists")]
    assert untolerated([SICK, HEALING], key_only) == [HEALING]
    assert untolerated([SICK, HEALING], [*key_only, toleration(key=HEALING_TAINT, value="needs-operator")]) == []
    assert untolerated([SICK, HEALING], []) == [SICK, HEALING]
    assert untolerated([], []) == []


def test_a_taint_is_written_as_kubectl_writes_one() -> None:
    assert taint_text(SICK) == "gpu.iluvatar.com/unhealthy=XID-64:NoSchedule"
    assert taint_text(BARE) == "gpu.iluvatar.com/unhealthy:NoSchedule"


def test_absent_or_null_tolerations_are_none_and_each_field_is_read() -> None:
    assert read_tolerations(None, "here") == ()
    assert read_tolerations([], "here") == ()
    assert toleration(key="k", operator="Exists", value=None, effect="NoSchedule", tolerationSeconds=5) == Toleration(
        "k", "Exists", "", "NoSchedule", 5
    )
    assert toleration() == Toleration()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"operator": "Exists"}, r"^here: tolerations is not a list$"),
        ("Exists", r"^here: tolerations is not a list$"),
        ([None], r"^here: tolerations\[0\] is not an object$"),
        ([{"operator": "Exists"}, "Exists"], r"^here: tolerations\[1\] is not an object$"),
        ([{"key": 7}], r"^here: tolerations\[0\]\.key is not a string$"),
        ([{"operator": ["Exists"]}], r"^here: tolerations\[0\]\.operator is not a string$"),
        ([{"value": True}], r"^here: tolerations\[0\]\.value is not a string$"),
        ([{"effect": {}}], r"^here: tolerations\[0\]\.effect is not a string$"),
        ([{"tolerationSeconds": "30"}], r"^here: tolerations\[0\]\.tolerationSeconds is not a whole number$"),
        ([{"tolerationSeconds": 1.5}], r"^here: tolerations\[0\]\.tolerationSeconds is not a whole number$"),
        ([{"tolerationSeconds": True}], r"^here: tolerations\[0\]\.tolerationSeconds is not a whole number$"),
    ],
)
def test_tolerations_that_are_not_device_tolerations_are_refused_naming_the_field(value: Any, message: str) -> None:
    with pytest.raises(ClaimError, match=message):
        read_tolerations(value, "here")
