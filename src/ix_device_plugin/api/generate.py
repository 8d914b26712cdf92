"""Regenerate the committed Python modules of the kubelet APIs from their upstream protos.

api.proto: the device plugin API v1beta1; podresources/api.proto: the pod-resources API v1;
dra_v1/api.proto and dra_v1beta1/api.proto: the DRA kubelet plugin API; pluginregistration/api.proto: the
plugin watcher's registration API v1; dra_health_v1/ and dra_health_v1alpha1/: the DRA device health API.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

API_DIR = Path(__file__).resolve().parent
SRC_ROOT = API_DIR.parent.parent
PROTOS = (
    API_DIR / "api.proto",
    API_DIR / "podresources" / "api.proto",
    API_DIR / "dra_v1" / "api.proto",
    API_DIR / "dra_v1beta1" / "api.proto",
    API_DIR / "pluginregistration" / "api.proto",
    API_DIR / "dra_health_v1" / "api.proto",
    API_DIR / "dra_health_v1alpha1" / "api.proto",
)
GENERATED = ("api_pb2.py", "api_pb2_grpc.py", "api_pb2.pyi")


def generate(out_dir: Path) -> list[tuple[Path, Path]]:
    """Run protoc (from grpcio-tools) on every proto under out_dir; (produced, committed) pairs."""
    from grpc_tools import protoc  # build-time dependency only

    pairs = []
    for proto in PROTOS:
        proto_rel = proto.relative_to(SRC_ROOT)
        args = [
            "protoc",
            f"-I{SRC_ROOT}",
            f"--python_out={out_dir}",
            f"--pyi_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            str(proto_rel),
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed on {proto}")
        pairs.extend((out_dir / proto_rel.parent / name, proto.parent / name) for name in GENERATED)
    return pairs


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        for produced, committed in generate(Path(tmp)):
            committed.write_text(produced.read_text())
            print(f"wrote {committed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
