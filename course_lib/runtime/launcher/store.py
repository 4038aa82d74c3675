"""Where the ranks meet: a TCPStore that the launcher itself hosts, listening on loopback only.

We bind 127.0.0.1:0 ourselves and hand the listening socket to the store: no fixed port, no
bind-then-close race, no collision between two kernels launching at the same moment.
"""
import os
import socket
from datetime import timedelta

MASTER_ADDR = "127.0.0.1"


def loopback_interface() -> str:
    names = [name for _, name in socket.if_nameindex()]
    return next((name for name in names if name.startswith("lo")), "lo")


class Rendezvous:
    def __init__(self, world_size: int, timeout_s: float = 300.0):
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind((MASTER_ADDR, 0))
        self._listener.listen(max(128, world_size))
        self.port = self._listener.getsockname()[1]
        self.world_size, self.timeout_s, self.store = world_size, timeout_s, None

    def serve(self) -> None:
        """Start the store on the listening socket, once every rank has been started.

        A rank that connects before waits in the socket's queue. The store's server is a thread of
        this process: a rank forked while it serves another rank's connection would inherit any lock
        that thread held at that instant, and could hang in its own store client (seen on 3 ranks).
        """
        from torch.distributed import TCPStore

        # The launcher plays torchrun's agent: it hosts the store and every rank joins as a client
        # (TORCHELASTIC_USE_AGENT_STORE below), so even `init_process_group("gloo")` in user code works;
        # user code that picks another address gets its own store (see rank.own_rendezvous).
        # The store takes the socket over (and closes it when freed); the libuv store can since
        # torch 2.8, the course's lower bound.
        self.store = TCPStore(MASTER_ADDR, self.port, self.world_size, is_master=True,
                              timeout=timedelta(seconds=self.timeout_s), wait_for_workers=False,
                              master_listen_fd=self._listener.detach(), use_libuv=True)

    def environment(self, rank: int, start_method: str) -> dict:
        values = {
            "RANK": rank, "LOCAL_RANK": rank, "WORLD_SIZE": self.world_size,
            "LOCAL_WORLD_SIZE": self.world_size, "GROUP_RANK": 0, "ROLE_RANK": rank,
            "ROLE_WORLD_SIZE": self.world_size, "MASTER_ADDR": MASTER_ADDR, "MASTER_PORT": self.port,
            "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": 0,
            # gloo's own connections between ranks stay on this machine too (unless told otherwise)
            "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", loopback_interface()),
            # Every rank finishes building the group before any starts: without this, a rank whose
            # function returns at once tears down while a peer is still connecting (gloo fails).
            "TORCH_DIST_INIT_BARRIER": os.environ.get("TORCH_DIST_INIT_BARRIER", "1"),
            "OMP_NUM_THREADS": "1" if start_method == "fork" else None,
        }
        return {key: str(value) for key, value in values.items() if value is not None}

    def close(self) -> None:
        self.store = None  # the server stops when the store object is freed
        self._listener.close()  # nothing once the store took it over

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
