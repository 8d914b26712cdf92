"""Self-healing GPUs, a node service of both front ends.

A chip a reset can fix is reset once no container holds it and returned to service; every health change and step is
a Node Event, a metric and a line of `list`.

NodeHealing (service.py) composes it for a front end from one HealingSettings (settings.py). The Healer (healer.py)
sees the chips' health and resets; Reservations (reservations.py) reserve a chip for its reset and keep the
node-health record (record.py, keeper.py); Telling (telling.py) says it all: Events (events.py), metrics
(metrics.py), the story file (story.py). The operator's way back is the Node annotation (operatorreturn.py)."""
