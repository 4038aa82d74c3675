"""Your own rendezvous in a rank: code that calls `init_process_group` itself (init_process_group=False).

At the launcher's address every rank joins the launcher's store, as under torchrun; at any other
address (a tutorial's fixed MASTER_PORT, a tcp:// URL) rank 0 hosts the store, as under plain
processes. A port already taken fails at once, and each rank tells the launcher where it went.
"""
import importlib
import os
from urllib.parse import parse_qsl, urlparse

# torch's flag for "the launcher hosts the store": every rank, rank 0 included, joins as a client
AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"


def follow_user_rendezvous(report) -> None:
    """Wrap this process's env:// and tcp:// rendezvous; `report(where)` tells the launcher.

    Call it before the user's code runs, while MASTER_PORT is still the launcher's.
    """
    # the module: `from torch.distributed import rendezvous` gives its function of that name.
    # Its private registry of URL schemes is the one place torch lets us step in before the store
    # is made; this module alone touches it (seen as {"env", "file", "tcp"} on torch 2.8 to 2.15,
    # the tested range).
    torch_rendezvous = importlib.import_module("torch.distributed.rendezvous")
    handlers = getattr(torch_rendezvous, "_rendezvous_handlers", None)
    if not isinstance(handlers, dict):
        return  # a torch without the registry: its own behaviour applies
    launcher_port = os.environ["MASTER_PORT"]
    for scheme in ("env", "tcp"):
        if scheme in handlers:
            handlers[scheme] = _following(scheme, handlers[scheme], launcher_port, report)


def _following(scheme: str, torch_handler, launcher_port: str, report):
    def handler(url, *args, **kwargs):  # a generator, like torch's: runs at the first next()
        try:
            host, port, rank, world_size = _where(scheme, url)
        except ValueError:  # a malformed address: torch's own handler says what is wrong with it
            yield from torch_handler(url, *args, **kwargs)
            return
        at_launcher = port == launcher_port
        if at_launcher:
            os.environ[AGENT_STORE] = "True"
        else:
            os.environ.pop(AGENT_STORE, None)  # rank 0 hosts the store itself
        address = f"{scheme}://{host}:{port}"
        report({"rank": rank, "world_size": world_size, "address": address,
                "hosted_by": "the launcher" if at_launcher else "rank 0"})
        try:
            yield from torch_handler(url, *args, **kwargs)
        except RuntimeError as exc:
            if rank == 0 and not at_launcher and "address already in use" in str(exc).lower():
                raise type(exc)(_port_in_use(port, address, exc)) from None
            raise

    return handler


def _where(scheme: str, url: str):
    """(host, port, rank, world_size) of a rendezvous URL; env:// reads them from the environment."""
    parsed = urlparse(url)
    query = dict(parse_qsl(parsed.query))
    if scheme == "env":
        host, port = os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")
    else:
        host, port = parsed.hostname or "", str(parsed.port or "")
    rank = int(query.get("rank", os.environ.get("RANK", -1)))
    world_size = int(query.get("world_size", os.environ.get("WORLD_SIZE", -1)))
    return host, port.strip(), rank, world_size


def _port_in_use(port: str, address: str, exc: BaseException) -> str:
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return (f"port {port} is in use: rank 0 cannot host the rendezvous at {address}, another program "
            f"holds that port (another kernel running the same tutorial?). Use another port, or "
            f"leave the address to the launcher (drop the lines that set MASTER_ADDR and "
            f"MASTER_PORT, and init_method): launch and spawn give every run a free port. "
            f"(torch said: {reason})")
