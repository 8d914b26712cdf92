"""One registration per socket and kubelet: kubelet 1.37 refuses a second registration of a socket it follows,
loses its client of that socket, and refuses the socket for good from then on (the next process of the plugin,
which serves the same per-pod socket after a container restart, would never be registered)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from helpers.support import RESOURCE, DaemonFactory, metric
from helpers.waits import stays, until

from ix_device_plugin.api import api_pb2
from ix_device_plugin.standins.kubelet import KubeletStandIn

POD_UID = "5f0c6a52-3d0e-4a57-9a51-0e6cb455aa01"


class AskedAgainKubelet(KubeletStandIn):
    """Kubelet 1.37 as the stand-in plays it, calling `during_register` once while it answers the next registration
    (after it dialed the plugin): a request that comes while a registration is under way."""

    def __init__(self, plugin_dir: Path) -> None:
        super().__init__(plugin_dir, refuses_connected=True)
        self.during_register: Callable[[], None] | None = None

    async def Register(self, request: api_pb2.RegisterRequest, context: grpc.aio.ServicerContext) -> api_pb2.Empty:
        answer = await super().Register(request, context)
        hook, self.during_register = self.during_register, None
        if hook is not None:
            hook()
        return answer


class SocketCheckingKubelet(KubeletStandIn):
    """The stand-in, noting at each registration whether the plugin's socket was there to dial."""

    def __init__(self, plugin_dir: Path) -> None:
        super().__init__(plugin_dir)
        self.socket_there: list[bool] = []

    async def Register(self, request: api_pb2.RegisterRequest, context: grpc.aio.ServicerContext) -> api_pb2.Empty:
        self.socket_there.append((self.plugin_dir / request.endpoint).exists())
        return await super().Register(request, context)


@pytest.fixture
async def kubelet_137(plugin_dir: Path) -> AskedAgainKubelet:
    standin = AskedAgainKubelet(plugin_dir)
    await standin.start()
    yield standin
    await standin.stop()


async def test_the_stand_in_refuses_a_socket_for_good_once_it_was_registered_twice(
    kubelet_137: AskedAgainKubelet, start_daemon: DaemonFactory
) -> None:
    """What the kubelet does (pkg/kubelet/cm/devicemanager: handler.connectClient drops every client of the socket
    when PluginConnected refuses it, so the first connection's end disconnects nothing): the stand-in is as strict."""
    from ix_device_plugin.kubelet.registration import register

    daemon = await start_daemon("BI-V100:1", pod_uid=POD_UID)
    await kubelet_137.wait_registered(RESOURCE, capacity=1)
    socket = daemon.endpoint.path.name
    with pytest.raises(Exception, match="already connected"):
        await register(kubelet_137.plugin_dir, socket, RESOURCE)
    await daemon.shutdown()
    with pytest.raises(Exception, match="already connected"):
        await register(kubelet_137.plugin_dir, socket, RESOURCE)


async def test_asked_again_while_the_kubelet_follows_the_socket_registers_nothing_more(
    kubelet_137: AskedAgainKubelet, start_daemon: DaemonFactory
) -> None:
    daemon = await start_daemon("BI-V100:2", pod_uid=POD_UID)
    await kubelet_137.wait_registered(RESOURCE, capacity=2)
    await until(lambda: daemon.registered, timeout=5)
    daemon.registrar.request()  # as the endpoint's restart and a kubelet restart each ask, one after the other
    await until(lambda: daemon.registered, timeout=5)
    await stays(lambda: len(kubelet_137.registrations) == 1, for_=0.5, message="one registration")
    assert metric(daemon, "ix_device_plugin_registration_failures_total") == 0


async def test_a_request_made_while_a_registration_is_under_way_is_answered_by_it_and_the_next_process_registers(
    kubelet_137: AskedAgainKubelet, start_daemon: DaemonFactory
) -> None:
    """A kubelet restart: the registration with the new kubelet is under way as the plugin is asked again. The
    kubelet has this socket from that registration; a second one would lose it for good, and the plugin's next
    process (its container restarted, the same per-pod socket) would never be registered."""
    daemon = await start_daemon("BI-V100:2", pod_uid=POD_UID)
    await kubelet_137.wait_registered(RESOURCE, capacity=2)
    await until(lambda: daemon.registered, timeout=5)
    kubelet_137.during_register = daemon.registrar.request
    await kubelet_137.restart()
    await kubelet_137.wait_registered(RESOURCE, capacity=2, timeout=10)
    await until(lambda: daemon.registered and kubelet_137.during_register is None, timeout=10)
    await stays(lambda: len(kubelet_137.registrations) == 2, for_=0.5, message="one registration per kubelet")
    await daemon.shutdown()
    following = await start_daemon("BI-V100:2", pod_uid=POD_UID)
    await until(lambda: following.registered, timeout=10)
    assert len(kubelet_137.registrations) == 3
    assert metric(following, "ix_device_plugin_registration_failures_total") == 0


async def test_no_registration_is_tried_while_the_plugin_socket_is_gone(
    plugin_dir: Path, start_daemon: DaemonFactory
) -> None:
    """The kubelet would dial a socket that is not there yet, holding the registration open meanwhile: the
    endpoint, serving again, asks once it has its socket."""
    kubelet = SocketCheckingKubelet(plugin_dir)
    await kubelet.start()
    try:
        daemon = await start_daemon("BI-V100:1", pod_uid=POD_UID)
        await kubelet.wait_registered(RESOURCE, capacity=1)
        await until(lambda: daemon.registered, timeout=5)
        daemon.endpoint.path.unlink()
        daemon.registrar.request()
        await until(lambda: len(kubelet.registrations) == 2 and daemon.registered, timeout=10)
        assert kubelet.socket_there == [True, True]
    finally:
        await kubelet.stop()


async def test_a_kubelet_restarting_between_the_registrars_look_and_its_dial_is_registered_with_once(
    kubelet_137: AskedAgainKubelet, start_daemon: DaemonFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Soak seed 699189, device plugin: a kubelet restart replaced kubelet.sock after the registrar looked at it and
    before it dialed, so the registration went to the new kubelet while the registrar noted the old one; seeing
    kubelet.sock new, it registered the socket again 11 ms later. The kubelet refused it as already connected and
    kept a lost endpoint, to which it later sent every allocation once the next pod's socket went (3 minutes of pods
    refused)."""
    from ix_device_plugin.deviceplugin import registrar as registrar_module

    daemon = await start_daemon("BI-V100:2", pod_uid=POD_UID)
    await kubelet_137.wait_registered(RESOURCE, capacity=2)
    await until(lambda: daemon.registered, timeout=5)
    real_register = registrar_module.register
    replaced: list[bool] = []

    async def kubelet_replaced_first(plugin_dir: Path, endpoint: str, name: str) -> None:
        if not replaced:  # the new kubelet serves a new kubelet.sock; this socket is not wiped yet
            replaced.append(True)
            await kubelet_137.stop()
            await kubelet_137.start()
        await real_register(plugin_dir, endpoint, name)

    monkeypatch.setattr(registrar_module, "register", kubelet_replaced_first)
    daemon.endpoint.path.unlink()  # the kubelet's restart wipes it first: the endpoint serves anew and asks
    await kubelet_137.wait_registered(RESOURCE, capacity=2, timeout=10)
    await until(lambda: daemon.registered and replaced == [True], timeout=10)
    await stays(lambda: len(kubelet_137.registrations) == 2, for_=3.0, message="one registration with the new one")
    assert metric(daemon, "ix_device_plugin_registration_failures_total") == 0
