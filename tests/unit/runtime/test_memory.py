"""The services' malloc arena limit: applied on glibc, left alone where the operator set MALLOC_ARENA_MAX."""

from __future__ import annotations

import os
import subprocess
import sys

CODE = "from ix_device_plugin.runtime.memory import limit_malloc_arenas; print(limit_malloc_arenas())"


def _run(env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.strip()


def test_the_limit_is_applied_unless_the_operator_chose_one() -> None:
    env = {key: value for key, value in os.environ.items() if key != "MALLOC_ARENA_MAX"}
    assert _run(env) == "True"  # glibc (the image and this runner)
    assert _run({**env, "MALLOC_ARENA_MAX": "4"}) == "False"


def test_freed_heap_memory_goes_back_to_the_system() -> None:
    # glibc's malloc_trim: True when it released some; large blocks freed at the heap's top always give some back
    code = (
        "import ctypes; from ix_device_plugin.runtime.memory import release_free_memory; "
        "libc = ctypes.CDLL(None); libc.malloc.restype = ctypes.c_void_p; libc.free.argtypes = (ctypes.c_void_p,); "
        "blocks = [libc.malloc(64 * 1024) for _ in range(200)]; [libc.free(b) for b in reversed(blocks)]; "
        "print(release_free_memory())"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "True"
