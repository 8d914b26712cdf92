"""The node-agent kit: builds, once from the settings, what both front ends run beside serving (the hardware
monitor, the node-health record, the node's role and reset turn, the GPU reset service, self-healing, the node
labels, telemetry and the probes) and owns their life (start, tasks, stop, liveness); a front end hands in only
what it alone knows (`frontend`: its chip guard, its health policy, its node labels, its duties while acting)."""
