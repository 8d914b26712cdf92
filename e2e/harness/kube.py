"""The real kubectl, as the tests' API client: objects in and out as dicts, every call with a deadline."""

from __future__ import annotations

import json
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .procs import run

Obj = dict[str, Any]


def kubeconfig_text(
    server: str, ca: Path, user: str, cert: Path | None = None, key: Path | None = None, token: str | None = None
) -> str:
    """A kubeconfig for one user of one cluster: a client certificate, or a bearer token."""
    credentials: dict[str, str] = {}
    if cert is not None and key is not None:
        credentials = {"client-certificate": str(cert), "client-key": str(key)}
    if token is not None:
        credentials = {"token": token}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "ix-e2e", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": "ix-e2e", "context": {"cluster": "ix-e2e", "user": user}}],
        "current-context": "ix-e2e",
    }
    return yaml.safe_dump(config, sort_keys=False)


class KubectlError(AssertionError):
    """kubectl failed; stderr says why (Forbidden, Invalid, NotFound, ...)."""

    def __init__(self, argv: Sequence[str], returncode: int, stderr: str) -> None:
        super().__init__(f"kubectl {' '.join(argv)}: exit code {returncode}: {stderr.strip()[-3000:]}")
        self.stderr = stderr


@dataclass(frozen=True)
class Kubectl:
    """kubectl with a fixed kubeconfig."""

    binary: Path
    kubeconfig: Path
    timeout: float = 60

    def __call__(self, *args: str, input_text: str | None = None, timeout: float | None = None) -> str:
        """Run kubectl args; stdout, or KubectlError."""
        argv = [str(self.binary), "--kubeconfig", str(self.kubeconfig), "--request-timeout=30s", *args]
        try:
            result = subprocess.run(
                argv,
                input=input_text,
                capture_output=True,
                text=True,
                timeout=timeout or self.timeout,
                check=False,
                stdin=None if input_text is not None else subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired as error:
            raise AssertionError(f"kubectl {' '.join(args)}: no answer within {timeout or self.timeout} s") from error
        if result.returncode != 0:
            raise KubectlError(args, result.returncode, result.stderr)
        return result.stdout

    def get(self, kind: str, name: str | None = None, namespace: str | None = None, *extra: str) -> Obj:
        """One object (or, without name, the List) as a dict."""
        args = ["get", kind, *([name] if name else []), "-o", "json", *extra]
        if namespace:
            args += ["-n", namespace]
        return json.loads(self(*args))

    def get_or_none(self, kind: str, name: str, namespace: str | None = None) -> Obj | None:
        """The object, or None when it does not exist."""
        try:
            return self.get(kind, name, namespace)
        except KubectlError as error:
            if "NotFound" in error.stderr or "not found" in error.stderr:
                return None
            raise

    def items(self, kind: str, namespace: str | None = None, *extra: str) -> list[Obj]:
        return self.get(kind, None, namespace, *extra).get("items", [])

    def apply(self, objects: Obj | Iterable[Obj], *extra: str) -> str:
        """Server-side apply of objects (a dict or several)."""
        documents = [objects] if isinstance(objects, dict) else list(objects)
        text = yaml.safe_dump_all(documents, sort_keys=False)
        return self(
            "apply", "--server-side", "--force-conflicts", "--field-manager=ix-e2e", "-f", "-", *extra, input_text=text
        )

    def create(self, objects: Obj | Iterable[Obj], *extra: str) -> str:
        documents = [objects] if isinstance(objects, dict) else list(objects)
        return self("create", "-f", "-", *extra, input_text=yaml.safe_dump_all(documents, sort_keys=False))

    def delete(self, kind: str, name: str, namespace: str | None = None, wait: bool = True) -> None:
        """Delete if present; with wait, until it is gone (bounded by kubectl's --timeout)."""
        args = ["delete", kind, name, "--ignore-not-found", f"--wait={'true' if wait else 'false'}", "--timeout=60s"]
        if namespace:
            args += ["-n", namespace]
        self(*args, timeout=90)

    def can_i(self, verb: str, resource: str, namespace: str | None = None) -> bool:
        """kubectl auth can-i, as this kubeconfig's user."""
        args = ["auth", "can-i", verb, resource, *(["-n", namespace] if namespace else [])]
        argv = [str(self.binary), "--kubeconfig", str(self.kubeconfig), *args]
        return run(argv, timeout=30, check=False).stdout.strip() == "yes"

    def with_kubeconfig(self, kubeconfig: Path) -> Kubectl:
        return Kubectl(self.binary, kubeconfig, self.timeout)


def api_request(account: Kubectl, method: str, path: str, body: Obj, content_type: str = "application/json") -> Obj:
    """One request to the API server with the bearer token of account's kubeconfig, as a client that does not read
    the object first (kubectl patch does) makes it: its JSON answer; KubectlError with the server's answer."""
    config = yaml.safe_load(account.kubeconfig.read_text())
    cluster, user = config["clusters"][0]["cluster"], config["users"][0]["user"]
    request = urllib.request.Request(
        cluster["server"] + path,
        data=json.dumps(body).encode(),
        method=method,
        headers={"Authorization": f"Bearer {user['token']}", "Content-Type": content_type},
    )
    context = ssl.create_default_context(cafile=cluster["certificate-authority"])
    try:
        with urllib.request.urlopen(request, context=context, timeout=30) as answer:
            return json.loads(answer.read())
    except urllib.error.HTTPError as error:
        raise KubectlError([method, path], error.code, error.read().decode(errors="replace")) from None
