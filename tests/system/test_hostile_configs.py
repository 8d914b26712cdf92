"""Hostile configs: each file in tests/hostile/configs through check-config and through a running plugin.

Nothing an operator can put in the ConfigMap hangs, crashes or bloats the plugin: check-config answers
within seconds and a bounded amount of memory with the expected message, and a running plugin that sees
the file through the kubelet's `..data` swap keeps serving the last good configuration and answering
/healthz.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml
from helpers.support import REPO_ROOT, RESOURCE, TESTS_DIR, spawn_plugin, stop_process
from helpers.waits import WaitFailed, stays
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ix_device_plugin.settings.configfile import parse_bytes
from ix_device_plugin.settings.configmap import load_document
from ix_device_plugin.settings.errors import SettingsError
from ix_device_plugin.settings.resolve import config_from
from ix_device_plugin.standins.kubelet import KubeletStandIn
from ix_device_plugin.tools.demo import ConfigMapDir

CORPUS = TESTS_DIR / "hostile" / "configs"
CHECK_TIMEOUT = 20  # seconds; a hang shows up as a timeout, far above the real figures (see bench/hostile.py)
MEMORY_BOUND_MB = 200

# file -> a fragment of the message check-config prints (None: the file is valid)
EXPECTED: dict[str, str | None] = {
    "alias_bomb_key.yaml": "line 1, column 4: anchor &a: anchors and aliases are not allowed here",
    "billion_laughs_value.yaml": "anchor &lol: anchors and aliases are not allowed here",
    "deep_nesting.yaml": "nested more than 32 levels deep",
    "binary.yaml": "holds a NUL byte at offset 0: this is binary data, not YAML",
    "utf16.yaml": "looks like UTF-16 or UTF-32 text; save it as UTF-8",
    "latin1.yaml": "byte 0xe9 at offset 32 is not UTF-8",
    "custom_tag_key.yaml": "line 1, column 1: the tag !foo is not allowed here",
    "custom_tag_value.yaml": "line 2, column 15: the tag !foo is not allowed here",
    "python_object.yaml": "the tag !!python/object/apply:os.system is not allowed here",
    "merge_key.yaml": "line 2, column 3: the merge key `<<` is not allowed here",
    "int_tag_on_text.yaml": "line 3: sharing.timeSlicing.replicas: !!int abc: not a valid int",
    "huge_integer.yaml": "a number of 5,000 characters (at most 30)",
    "replicas_billion.yaml": "replicas: expected at most 1024 replicas per GPU, got 1000000000",
    "replicas_negative.yaml": "replicas: expected a whole number >= 0 (0 or 1 means no sharing), got -1",
    "replicas_infinite.yaml": "replicas: expected a whole number >= 0, got inf",
    "duplicate_keys.yaml": None,
    "date_value.yaml": "flags.splitboard: expected true or false, got 2001-12-14",
    "null_value.yaml": None,  # the default name, as Iluvatar's plugin 4.4.0 reads null
    "tabs.yaml": "line 2, column 1: invalid YAML: found character '\\t' that cannot start any token",
    "nul_byte.yaml": "holds a NUL byte at offset 25",
    "set_tag.yaml": "the tag !!set is not allowed here",
    "list_as_key.yaml": "line 1: top level: keys must be plain names, got a list",
    "two_documents.yaml": None,
    "long_renamed_name.yaml": "is advertised as example.com/" + "g" * 60 + ".shared, which is not a valid",
    "bom_then_valid.yaml": None,
    "configmap_valid.yaml": None,
    "configmap_invalid.yaml": None,
    "configmap_without_ix_config.yaml": "the ConfigMap has no data.ix-config key, which the plugin reads",
    "configmap_alias_in_data.yaml": "anchor &cfg: anchors and aliases are not allowed here",
}
# Files Iluvatar's plugin 4.4.0 runs with that a strict reading refuses: valid with this warning, invalid with
# --strict (the message then starts the same, up to the first `;`).
LENIENT: dict[str, str] = {
    "duplicate_keys.yaml": "line 3: flags.splitboard: given 2 times (line 2 and 3); as Iluvatar's plugin 4.4.0 reads "
    "it, the last one (line 3) is used",
    "two_documents.yaml": "line 3: top level: a second YAML document: only the first document is read",
    "configmap_invalid.yaml": "configmap_invalid.yaml: data.ix-config: line 8: flags.splitbord: unknown key, ignored",
}
# The worst of them, also run through a live plugin.
LIVE = ("alias_bomb_key.yaml", "deep_nesting.yaml", "binary.yaml", "huge_integer.yaml", "replicas_billion.yaml")


# Runs check-config in this process, then appends its peak resident memory (VmHWM: since exec only, so
# not the pages a fork copied from a large test runner) to stderr's last line.
MEASURED_CHECK = """
import sys
from ix_device_plugin.cli import main
try:
    code = main(["check-config", *sys.argv[1:]])
finally:
    peak = next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    print(f"peak-kib={peak}", file=sys.stderr)
sys.exit(code)
"""


def check_config(path: Path, *flags: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run check-config on path; also that process's own peak resident memory in MB."""
    command = [sys.executable, "-c", MEASURED_CHECK, str(path), *flags]
    result = subprocess.run(command, capture_output=True, text=True, timeout=CHECK_TIMEOUT)
    *lines, last = result.stderr.rstrip("\n").split("\n")
    assert last.startswith("peak-kib="), result.stderr
    stderr = "".join(line + "\n" for line in lines)
    return subprocess.CompletedProcess(command, result.returncode, result.stdout, stderr), int(last[9:]) / 1024


def test_the_corpus_and_the_table_agree() -> None:
    assert sorted(path.name for path in CORPUS.iterdir()) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_check_config_names_the_problem(name: str) -> None:
    result, peak_mb = check_config(CORPUS / name)
    assert "Traceback" not in result.stderr
    assert peak_mb < MEMORY_BOUND_MB
    message = EXPECTED[name]
    if message is None:
        assert result.returncode == 0, result.stderr
        assert "valid" in result.stdout
        if name in LENIENT:
            assert f"warning: {CORPUS / name}: " in result.stderr
            assert LENIENT[name] in result.stderr, result.stderr
    else:
        assert result.returncode == 1
        assert message in result.stderr, result.stderr
        assert result.stderr.strip().endswith("invalid")


@pytest.mark.parametrize("name", sorted(LENIENT))
def test_check_config_strict_refuses_what_the_plugin_reads_with_a_warning(name: str) -> None:
    result, _ = check_config(CORPUS / name, "--strict")
    assert result.returncode == 1
    assert LENIENT[name].split(";")[0].split(": only")[0].removesuffix(", ignored") in result.stderr, result.stderr
    assert result.stderr.strip().endswith("invalid")


def test_a_file_bigger_than_a_config_map_is_refused_without_reading_it_all(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    with big.open("wb") as stream:
        stream.write(b"flags:\n  splitboard: true\n")
        stream.write(b"# padding\n" * 300_000)
    result, peak_mb = check_config(big)
    assert result.returncode == 1
    assert "more than a ConfigMap can hold (1,048,576 bytes)" in result.stderr
    assert peak_mb < MEMORY_BOUND_MB


def test_check_config_reads_stdin() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ix_device_plugin", "check-config", "-"],
        input=(CORPUS / "duplicate_keys.yaml").read_text(),
        capture_output=True,
        text=True,
        timeout=CHECK_TIMEOUT,
    )
    assert result.returncode == 0
    assert "warning: <stdin>: line 3: flags.splitboard: given 2 times (line 2 and 3)" in result.stderr


def test_the_shipped_config_map_manifest_is_valid() -> None:
    manifest = REPO_ROOT / "deployments" / "static" / "ix-config.yaml"
    result, _ = check_config(manifest)
    assert result.returncode == 0, result.stderr
    assert "valid" in result.stdout


# ---- a running plugin ---------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _healthz(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
        return int(response.status)


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


async def test_a_running_plugin_keeps_the_last_good_config_through_every_bad_one(
    kubelet: KubeletStandIn, plugin_dir: Path, short_dir: Path
) -> None:
    configmap = ConfigMapDir(short_dir / "ixconfig")
    configmap.write("sharing:\n  timeSlicing:\n    replicas: 2\n")
    port = _free_port()
    log = short_dir / "log"
    process = spawn_plugin(
        plugin_dir, "--config", str(configmap.path), "--health-address", f"127.0.0.1:{port}", log_file=log
    )
    try:
        await kubelet.wait_registered(RESOURCE, capacity=4, timeout=20)
        for name in LIVE:
            configmap.write((CORPUS / name).read_bytes())
            # the plugin notices within a second
            try:
                await stays(lambda: process.poll() is None, for_=1.5, message=f"the plugin running with {name}")
            except WaitFailed:
                pytest.fail(f"the plugin died of {name}: {log.read_text()[-2000:]}")
            assert await asyncio.to_thread(_healthz, port) == 200
            assert kubelet.resources[RESOURCE].connected
            assert kubelet.capacity(RESOURCE) == 4  # the last good config is still served
            assert _rss_mb(process.pid) < MEMORY_BOUND_MB
        configmap.write("sharing:\n  timeSlicing:\n    replicas: 3\n")
        await kubelet.wait_registered(RESOURCE, capacity=6, timeout=5)  # and a good edit still applies
    finally:
        stop_process(process)


# ---- generated documents ------------------------------------------------------------------------

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**40), 10**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.dates(),
)
_KEYS = st.sampled_from(("flags", "sharing", "timeSlicing", "replicas", "splitboard", "resourceName", "<<"))
_documents = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12) | _KEYS, inner, max_size=4)
    ),
    max_leaves=30,
)
_decorations = st.sampled_from(["", "!foo ", "!!int ", "!!str ", "&a ", "*a ", "!!python/name:os.system ", "? "])


@given(_documents, st.sampled_from(["utf-8", "utf-16", "latin-1", "utf-8-sig"]), _decorations, st.integers(0, 40))
@settings(suppress_health_check=list(HealthCheck), database=None)
def test_any_document_is_a_config_or_a_config_error(document, encoding, decoration, depth) -> None:  # type: ignore[no-untyped-def]
    text = decoration + yaml.safe_dump(document, default_flow_style=depth % 2 == 0, allow_unicode=True)
    text = "[" * depth + text.strip() + "]" * depth if depth > 20 else text
    data = text.encode(encoding, errors="replace")
    for parse in (lambda: config_from(parse_bytes(data, "generated"), {}), lambda: load_document(data, "generated")):
        try:
            parse()
        except SettingsError as error:
            assert error.messages and all(message.startswith("generated") for message in error.messages)
