"""Regenerate the committed Python modules of the v1beta1 API from api.proto."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

API_DIR = Path(__file__).resolve().parent
SRC_ROOT = API_DIR.parent.parent
PROTO = API_DIR / "api.proto"
GENERATED = ("api_pb2.py", "api_pb2_grpc.py", "api_pb2.pyi")


def generate(out_dir: Path) -> list[Path]:
    """Run protoc (from grpcio-tools) on api.proto, writing the modules under out_dir."""
    from grpc_tools import protoc  # build-time dependency only

    proto_rel = PROTO.relative_to(SRC_ROOT)
    args = [
        "protoc",
        f"-I{SRC_ROOT}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        str(proto_rel),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {PROTO}")
    produced = out_dir / proto_rel.parent
    return [produced / name for name in GENERATED]


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        for path in generate(Path(tmp)):
            (API_DIR / path.name).write_text(path.read_text())
            print(f"wrote {API_DIR / path.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
