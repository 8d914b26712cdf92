"""The kubelet DRA plugin API v1 (`k8s.io.kubelet.pkg.apis.dra.v1`): upstream proto and generated modules."""
