"""Container images built on the spot, as OCI archives that `ctr images import` loads: nothing is pulled.

`busybox_image` holds a static busybox (Debian's busybox-static) with a link per applet; `pause_image`
holds the cluster's own pause binary (e2e/cluster/tools/pause), the pod sandbox image.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

BUSYBOX_IMAGE = "localhost/ix-e2e/busybox:1"
PAUSE_IMAGE = "localhost/ix-e2e/pause:1"
BUSYBOX_CANDIDATES = ("/bin/busybox", "/usr/bin/busybox")

LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar"
CONFIG_MEDIA_TYPE = "application/vnd.oci.image.config.v1+json"
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_MEDIA_TYPE = "application/vnd.oci.image.index.v1+json"


@dataclass(frozen=True)
class FileEntry:
    """One entry of an image layer: a file (with content), a directory or a symlink (with target)."""

    path: str
    content: bytes | None = None
    mode: int = 0o755
    symlink: str | None = None


def find_static_busybox() -> Path | None:
    """A statically linked busybox on this host, or None."""
    for candidate in BUSYBOX_CANDIDATES:
        path = Path(candidate)
        if path.is_file() and _is_static(path):
            return path
    found = shutil.which("busybox")
    return Path(found) if found and _is_static(Path(found)) else None


def _is_static(path: Path) -> bool:
    """True when the ELF file names no dynamic loader in its first page (where PT_INTERP points)."""
    with path.open("rb") as file:
        head = file.read(4096)
    return head.startswith(b"\x7fELF") and b"ld-linux" not in head and b"ld-musl" not in head


def busybox_entries(busybox: Path) -> list[FileEntry]:
    """/bin/busybox, a /bin link per applet and the usual empty top-level directories."""
    applets = subprocess.run([str(busybox), "--list"], check=True, capture_output=True, text=True).stdout.split()
    entries = [FileEntry(path) for path in ("bin", "dev", "etc", "proc", "sys", "tmp", "var", "run")]
    entries.append(FileEntry("bin/busybox", busybox.read_bytes()))
    entries += [FileEntry(f"bin/{applet}", symlink="busybox") for applet in sorted(applets) if applet != "busybox"]
    entries.append(FileEntry("etc/passwd", b"root:x:0:0:root:/:/bin/sh\n", 0o644))
    entries.append(FileEntry("etc/group", b"root:x:0:\n", 0o644))
    return entries


def layer_tar(entries: list[FileEntry]) -> bytes:
    """An uncompressed, reproducible tar of entries (owned by root, mtime 0)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for entry in entries:
            info = tarfile.TarInfo(entry.path)
            info.mode = entry.mode
            if entry.symlink is not None:
                info.type = tarfile.SYMTYPE
                info.linkname = entry.symlink
                archive.addfile(info)
            elif entry.content is None:
                info.type = tarfile.DIRTYPE
                archive.addfile(info)
            else:
                info.size = len(entry.content)
                archive.addfile(info, io.BytesIO(entry.content))
    return buffer.getvalue()


def oci_archive(name: str, entries: list[FileEntry], command: list[str]) -> bytes:
    """An OCI image layout in a tar (one linux/amd64 image with one layer), named `name` for containerd."""
    layer = layer_tar(entries)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": ["PATH=/bin"], "Cmd": command, "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [_digest(layer)]},
    }
    config_blob = _json(config)
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "config": {"mediaType": CONFIG_MEDIA_TYPE, "digest": _digest(config_blob), "size": len(config_blob)},
        "layers": [{"mediaType": LAYER_MEDIA_TYPE, "digest": _digest(layer), "size": len(layer)}],
    }
    manifest_blob = _json(manifest)
    index = {
        "schemaVersion": 2,
        "mediaType": INDEX_MEDIA_TYPE,
        "manifests": [
            {
                "mediaType": MANIFEST_MEDIA_TYPE,
                "digest": _digest(manifest_blob),
                "size": len(manifest_blob),
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": name},
            }
        ],
    }
    files = [
        FileEntry("oci-layout", _json({"imageLayoutVersion": "1.0.0"}), 0o644),
        FileEntry("index.json", _json(index), 0o644),
        FileEntry("blobs", None),
        FileEntry("blobs/sha256", None),
    ]
    files += [
        FileEntry(f"blobs/sha256/{_digest(blob).removeprefix('sha256:')}", blob, 0o644)
        for blob in (layer, config_blob, manifest_blob)
    ]
    return layer_tar(files)


def busybox_image(busybox: Path) -> bytes:
    """The OCI archive of BUSYBOX_IMAGE."""
    return oci_archive(BUSYBOX_IMAGE, busybox_entries(busybox), ["sh"])


def pause_image(pause_binary: Path) -> bytes:
    """The OCI archive of PAUSE_IMAGE: /pause, the sandbox process."""
    return oci_archive(PAUSE_IMAGE, [FileEntry("pause", pause_binary.read_bytes())], ["/pause"])


def _digest(blob: bytes) -> str:
    return "sha256:" + hashlib.sha256(blob).hexdigest()


def _json(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
