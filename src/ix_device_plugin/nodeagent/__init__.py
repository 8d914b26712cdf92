"""The node-agent kit, which builds once from the settings what both front ends run beside serving, and owns its life.

The hardware monitor, the node-health record, the node's role and reset turn, the GPU reset service, self-healing,
the node labels, telemetry and the probes, started, run, stopped and checked for liveness by the kit; a front end
hands in only what it alone knows (`frontend`: its chip guard, its health policy, its node labels, its duties while
acting).
"""
