"""Loopback probes and ports: HTTP status/JSON without any proxy, free ports, EF_<NAME>_PORT."""

from __future__ import annotations

import json
import os
import socket
import urllib.error
import urllib.request

from stacklib.state import StackError

HOST = "127.0.0.1"


DEFAULT_PORTS = {"s3": 8333, "mlflow": 5000, "prefect": 4200, "hub": 8765}


# Loopback only, so never through a proxy from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_status(url: str, method: str = "GET", body: bytes | None = None, timeout_s: float = 2.0) -> int | None:
    """The HTTP status of any answer (4xx/5xx included), or None when nothing answered."""
    request = urllib.request.Request(url, data=body, method=method, headers={"Content-Type": "application/json"})
    try:
        with _OPENER.open(request, timeout=timeout_s) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code
    except (OSError, urllib.error.URLError):
        return None


def http_json(url: str, method: str = "GET", payload: object = None, timeout_s: float = 2.0) -> object:
    body = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(url, data=body, method=method, headers={"Content-Type": "application/json"})
    with _OPENER.open(request, timeout=timeout_s) as response:
        return json.loads(response.read())


def port_is_free(port: int) -> bool:
    # SO_REUSEADDR so a socket in TIME_WAIT from a just-stopped stack does not count as busy; a listener does.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port nothing listens on now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def service_port(name: str) -> int:
    raw = os.environ.get(f"EF_{name.upper()}_PORT", "")
    port = int(raw) if raw.isdigit() else DEFAULT_PORTS[name] if not raw else -1
    if not 0 < port < 65536:
        raise StackError(f"EF_{name.upper()}_PORT={raw!r} is not a port number")
    return port
