"""The kubelet DRA plugin API v1beta1 (`k8s.io.kubelet.pkg.apis.dra.v1beta1`): upstream proto and generated modules."""
