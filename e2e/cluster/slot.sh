#!/usr/bin/env bash
# slot.sh COMMAND [ARG...]: run COMMAND (an end-to-end pytest process) in a slot of its own, so that several
# one-node clusters run side by side on one machine (e2e/run.py, docs/testing.md "Side by side").
#
# A slot is a new network namespace and a private mount namespace with a number, IX_E2E_SLOT (1-8), held by a
# lock in the build cache for COMMAND's lifetime. In it every host-wide name a cluster uses is the slot's own:
#   - the network: loopback and a node address 10.254.<slot>.1 with the default route (the cluster's bridge, pod
#     and Service addresses, ports and kube-proxy's tables are then the slot's; nothing outside is reachable);
#   - /dev: a copy of the host's device nodes, links and folders on a tmpfs, with the host's pts, shm, mqueue and
#     hugepages mounts bound in, so that the simulated GPUs' /dev/iluvatar* and /dev/itrctl are the slot's;
#   - /var/lib/kubelet (where the cluster binds its device-plugin folder), /run/nri (containerd's NRI socket),
#     /var/log/pods and /var/log/containers (the kubelet's logs): empty tmpfs.
# The cgroup root is named after the slot by the harness (e2e/harness/slots.py). The mount points must exist on
# the host: e2e/run.py makes the missing ones before the first slot and removes them after the last (a folder
# removed while another namespace has a mount on it takes that mount away).
#
# `slot.sh --mount-points` prints those folders. Root only (unshare, mount). Environment: IX_E2E_CACHE (the build cache, where the slot locks are).
set -euo pipefail

MOUNT_POINTS=(/var/lib/kubelet /run/nri /var/log/pods /var/log/containers)

die() {
    echo "slot.sh: $*" >&2
    exit 1
}

if [ "${1:-}" = --mount-points ]; then
    printf '%s\n' "${MOUNT_POINTS[@]}"
    exit 0
fi
if [ "${IX_E2E_SLOT_ENTERED:-}" != 1 ]; then
    [ "$#" -gt 0 ] || die "usage: slot.sh COMMAND [ARG...] | slot.sh --mount-points"
    [ "$(id -u)" = 0 ] || die "a slot needs root (network and mount namespaces)"
    for point in "${MOUNT_POINTS[@]}"; do
        [ -d "$point" ] || die "$point is missing on the host (e2e/run.py makes it before the slots start)"
    done
    IX_E2E_SLOT_ENTERED=1 exec unshare --net --mount --propagation private -- "$0" "$@"
fi
unset IX_E2E_SLOT_ENTERED
# Nothing of the set-up on stdout: COMMAND may be a pytest-xdist worker, whose stdin and stdout are its channel.
exec 3>&1 1>&2

cache="${IX_E2E_CACHE:-/var/cache/ix-device-plugin-e2e}"
mkdir -p "$cache/slots"
slot=""
for number in 1 2 3 4 5 6 7 8; do
    # fd 9 stays open in COMMAND (exec keeps it), so the slot is held until COMMAND exits.
    exec 9>"$cache/slots/$number.lock"
    if flock -n 9; then
        slot=$number
        break
    fi
    exec 9>&-
done
[ -n "$slot" ] || die "all 8 slots are taken ($cache/slots/*.lock)"

# The network: the kubelet refuses a loopback node address, and the harness finds the node's address as the one
# the default route leaves from (harness/host.primary_ip). No dummy interface everywhere: a veth pair kept inside.
ip link set lo up
ip link add ixslot type veth peer name ixslot-peer
ip address add "10.254.$slot.1/24" dev ixslot
ip link set ixslot up
ip link set ixslot-peer up
ip route add default dev ixslot

# /dev: device nodes, links and folders copied (the tmpfs keeps device nodes working: no nodev), the host's
# mounted file systems under it bound in as they are.
staging="$(mktemp -d /tmp/ix-e2e-slot-dev.XXXXXX)"
mount -t tmpfs -o mode=0755,nosuid,size=16m "ix-e2e-slot$slot-dev" "$staging"
cp -a --one-file-system /dev/. "$staging/"
while read -r point; do
    mkdir -p "$staging${point#/dev}"
    mount --rbind "$point" "$staging${point#/dev}"
done < <(findmnt -rn -o TARGET | grep '^/dev/' | awk -F/ 'NF == 3')
mount --move "$staging" /dev
rmdir "$staging"

for point in "${MOUNT_POINTS[@]}"; do
    mount -t tmpfs -o mode=0755 "ix-e2e-slot$slot" "$point"
done

export IX_E2E_SLOT="$slot"
exec "$@" 1>&3 3>&-
