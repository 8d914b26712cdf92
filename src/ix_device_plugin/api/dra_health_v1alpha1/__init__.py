"""The kubelet DRA health API v1alpha1 (`v1alpha1.DRAResourceHealth`): upstream proto and generated modules."""
