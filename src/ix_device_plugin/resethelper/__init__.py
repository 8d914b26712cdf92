"""`ix-device-plugin reset-helper`: the privileged helper that resets chips for the unprivileged agent.

`ixsmi -r` needs CAP_SYS_ADMIN and a writable /sys, which the agent's container does not hold. This helper runs in a
second container of the agent's pod, privileged, and does nothing else: it listens on a unix socket
(hardware/resetprotocol.py), checks that the chip it is asked about is one of the node's, and runs the one fixed
command, one reset at a time, under a rate limit. It holds no ServiceAccount token, reads no config file and runs
no shell: what it can be made to do is exactly `ixsmi -r -i <a chip of this node>`.
"""
