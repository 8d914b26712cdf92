"""The kubelet pod-resources API v1: upstream proto and generated modules."""
