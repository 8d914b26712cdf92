"""How a node's agent reaches the GPU device nodes: the decision from what it was deployed with and what it found,
and the NRI injector's status as the agent reads it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ix_device_plugin.core.deviceaccess import (
    ACCESS_LABEL,
    ACCESS_VALUES,
    NONE,
    NRI,
    PRIVILEGED,
    RUNTIME,
    InjectorStatus,
    decide,
    parse_injector_status,
)

pytestmark = pytest.mark.unit

REFUSED = "cannot open /dev/iluvatar0 (Operation not permitted): no GPU access here; give the agent's container ..."
NO_SOCKET = InjectorStatus(registered=False, why="no NRI socket at /var/run/nri/nri.sock (no such file or directory)")


@pytest.mark.parametrize("deployed", [NRI, RUNTIME, PRIVILEGED])
@pytest.mark.parametrize("fallback", [PRIVILEGED, NONE])
def test_a_container_that_opens_the_nodes_shows_how_it_was_deployed(deployed: str, fallback: str) -> None:
    access = decide(deployed, fallback, None, InjectorStatus(registered=True))
    assert (access.value, access.usable, access.missing) == (deployed, True, "")


def test_without_nri_the_node_moves_to_the_privileged_daemonset_saying_why_in_the_injectors_words() -> None:
    access = decide(NRI, PRIVILEGED, REFUSED, NO_SOCKET)
    assert access.value == PRIVILEGED and not access.usable
    assert access.missing.startswith("no GPU device nodes from the NRI injector: no NRI socket at /var/run/nri")
    assert f"{ACCESS_LABEL}={PRIVILEGED}" in access.missing and "strict=true" in access.missing


def test_in_strict_mode_the_node_gets_no_gpus_and_is_told_to_turn_nri_on() -> None:
    access = decide(NRI, NONE, REFUSED, NO_SOCKET)
    assert access.value == NONE and not access.usable
    assert "no NRI socket" in access.missing and "strict mode forbids the privileged fallback" in access.missing


def test_a_runtime_that_gave_nothing_falls_back_with_the_refused_open_as_the_reason() -> None:
    access = decide(RUNTIME, PRIVILEGED, REFUSED, None)
    assert access.value == PRIVILEGED and access.missing.startswith(REFUSED)


def test_an_injector_that_registered_but_gave_nothing_is_judged_by_the_open() -> None:
    access = decide(NRI, NONE, REFUSED, InjectorStatus(registered=True))
    assert access.value == NONE and access.missing.startswith(REFUSED)


def test_an_nri_pod_without_the_injectors_status_says_the_sidecar_may_be_missing() -> None:
    access = decide(NRI, PRIVILEGED, REFUSED, None)
    assert access.value == PRIVILEGED and "the NRI injector left no status" in access.missing


def test_a_privileged_agent_keeps_its_daemonset_even_when_it_cannot_open_the_nodes() -> None:
    """Any other value would move the node back to the unprivileged DaemonSet, and back again."""
    access = decide(PRIVILEGED, NONE, REFUSED, None)
    assert access.value == PRIVILEGED and not access.usable and "driver" in access.missing


@given(
    deployed=st.sampled_from([NRI, RUNTIME, PRIVILEGED]),
    fallback=st.sampled_from([PRIVILEGED, NONE]),
    problem=st.none() | st.text(max_size=50),
    registered=st.none() | st.booleans(),
)
def test_the_decision_is_always_a_label_value_and_says_what_is_missing_exactly_when_unusable(
    deployed: str, fallback: str, problem: str | None, registered: bool | None
) -> None:
    injector = None if registered is None else InjectorStatus(registered, "" if registered else "why")
    access = decide(deployed, fallback, problem, injector)
    assert access.value in ACCESS_VALUES
    assert access.usable == (problem is None) and bool(access.missing) == (not access.usable)
    if access.value == PRIVILEGED and deployed != PRIVILEGED:
        assert fallback == PRIVILEGED


def test_the_injectors_status_lines_are_read() -> None:
    assert parse_injector_status("registered\n") == InjectorStatus(registered=True)
    assert parse_injector_status("unavailable: no NRI socket at /x (gone)\n") == InjectorStatus(
        registered=False, why="no NRI socket at /x (gone)"
    )


@pytest.mark.parametrize("text", ["", "\n", "registeredx", "unavailable", "maybe: later", "REGISTERED"])
def test_anything_else_is_refused_naming_what_was_found(text: str) -> None:
    with pytest.raises(ValueError, match="is neither 'registered' nor 'unavailable'"):
        parse_injector_status(text)


@given(st.text())
def test_any_text_is_read_or_refused_with_a_value_error(text: str) -> None:
    try:
        status = parse_injector_status(text)
    except ValueError as error:
        assert len(str(error)) < 200  # the text is cut, never quoted whole
    else:
        assert status.registered or status.why == status.why.strip()
