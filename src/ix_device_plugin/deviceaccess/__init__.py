"""Device access, a node service of both front ends: how this node's agent reaches the GPU device nodes.

Decided at start (core/deviceaccess.py) and shown per node (status: the NRI injector's word; service: label, Event,
metric).
"""
