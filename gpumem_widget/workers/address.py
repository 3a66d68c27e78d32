"""Where a worker finds its notebook: two addresses and a key, carried in the environment.

The extension exports these variables into the kernel's environment when it loads, so every
process the notebook spawns (torch.multiprocessing, accelerate's notebook_launcher, a torchrun
subprocess) inherits them; `%gpumem workers --env` prints them for a job started elsewhere.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

ADDRESS_VAR = "GPUMEM_WIDGET_ADDRESS"  # the kernel's PULL socket: workers push samples there
CONTROL_VAR = "GPUMEM_WIDGET_CONTROL"  # the kernel's PUB socket: cell edges, recording
KEY_VAR = "GPUMEM_WIDGET_KEY"  # hex HMAC-SHA256 key, fresh per session
VARIABLES = (ADDRESS_VAR, CONTROL_VAR, KEY_VAR)

_TCP = re.compile(r"^tcp://(?P<host>\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.-]+):(?P<port>\d{1,5})$")


class AddressError(ValueError):
    """An address or key that cannot be used, with what is wrong with it."""


@dataclass(frozen=True, slots=True)
class WorkerAddress:
    samples: str  # tcp://host:port
    control: str  # tcp://host:port
    key: bytes

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> WorkerAddress | None:
        """The address in `env` (default os.environ); None when any variable is missing."""
        env = os.environ if env is None else env
        samples, control, key = (env.get(v) for v in VARIABLES)
        if not samples or not control or not key:
            return None
        return cls.parse(samples, control, key)

    @classmethod
    def parse(cls, samples: str, control: str, key_hex: str) -> WorkerAddress:
        for name, value in ((ADDRESS_VAR, samples), (CONTROL_VAR, control)):
            host_port(value, name)
        try:
            key = bytes.fromhex(key_hex)
        except ValueError:
            raise AddressError(f"{KEY_VAR} is not hex") from None
        if len(key) < 16:
            raise AddressError(f"{KEY_VAR} is too short ({len(key)} bytes; at least 16)")
        return cls(samples, control, key)

    def env(self) -> dict[str, str]:
        return {ADDRESS_VAR: self.samples, CONTROL_VAR: self.control, KEY_VAR: self.key.hex()}

    def export_lines(self) -> str:
        """Shell lines that point a job started elsewhere at this notebook."""
        return "\n".join(f"export {k}={v}" for k, v in self.env().items())


def host_port(address: str, what: str = "address") -> tuple[str, int]:
    """("host", port) of a tcp://host:port address; AddressError when it is not one."""
    m = _TCP.match(address)
    if m is None:
        raise AddressError(f"{what}: {address!r} is not tcp://HOST:PORT")
    port = int(m["port"])
    if not 0 < port < 65536:
        raise AddressError(f"{what}: port {port} is out of range")
    return m["host"].strip("[]"), port


def reserve(interface: str = "127.0.0.1") -> WorkerAddress:
    """An address for this kernel's hub, chosen before the hub exists (`%load_ext` exports it at
    once, so a process the loading cell starts already inherits it; the hub binds it a moment
    later, on the thread that builds the session). Two ports free now, and a fresh key."""
    import socket

    from gpumem_widget.workers.signing import new_key

    family = socket.AF_INET6 if ":" in interface else socket.AF_INET
    host = f"[{interface}]" if ":" in interface else interface
    sockets = [socket.socket(family, socket.SOCK_STREAM) for _ in range(2)]
    try:
        for s in sockets:  # both open at once: two different ports
            s.bind((interface, 0))
        samples, control = (int(s.getsockname()[1]) for s in sockets)
    finally:
        for s in sockets:
            s.close()
    return WorkerAddress(f"tcp://{host}:{samples}", f"tcp://{host}:{control}", new_key())
