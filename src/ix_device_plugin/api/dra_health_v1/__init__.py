"""The kubelet DRA health API v1 (`v1.DRAResourceHealth`): upstream proto and generated modules."""
