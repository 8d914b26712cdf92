"""The kubelet plugin registration API v1 (package `pluginregistration`): upstream proto and generated modules."""
