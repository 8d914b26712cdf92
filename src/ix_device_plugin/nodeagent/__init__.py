"""The node-agent kit, which builds once from the settings what both front ends run beside serving.

The hardware monitor, the node-health record, the node's role, the GPU reset service with its turn, self-healing,
telemetry and the probes; a front end hands in only what it alone knows (its chip guard, its health policy, what
acting starts for it).
"""
