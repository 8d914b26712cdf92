"""Clients of the kubelet: unix sockets, device plugin registration, pod resources."""
