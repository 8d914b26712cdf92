"""The kubelet device plugin API v1beta1: proto and generated modules."""

from ix_device_plugin.api import api_pb2, api_pb2_grpc

API_VERSION = "v1beta1"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"

__all__ = ["API_VERSION", "HEALTHY", "UNHEALTHY", "api_pb2", "api_pb2_grpc"]
