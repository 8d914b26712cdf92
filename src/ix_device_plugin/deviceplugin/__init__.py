"""The device plugin front end: reconcile loop, endpoint, registrar, gRPC service, node files."""
