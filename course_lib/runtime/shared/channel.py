"""Messages between the launcher and its ranks: length-prefixed cloudpickle frames over pipes.

Tensors are moved to the CPU as they are pickled, so a rank can return CUDA tensors.
"""
import io
import os
import pickle
import struct
import sys
import threading

import cloudpickle

_HEADER = struct.Struct("!Q")
_writing = threading.Lock()  # a rank's main thread and its collectives thread share the messages pipe


class _CPUPickler(cloudpickle.CloudPickler):
    """cloudpickle, except that tensors on an accelerator are copied to the CPU first."""

    def reducer_override(self, obj):
        torch = sys.modules.get("torch")  # no torch loaded: no tensors to move
        if torch is not None and isinstance(obj, torch.Tensor) and obj.device.type not in ("cpu", "meta"):
            cpu = obj.detach().cpu().requires_grad_(obj.requires_grad)
            return cpu.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
        return super().reducer_override(obj)


def dumps(obj) -> bytes:
    buffer = io.BytesIO()
    _CPUPickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buffer.getvalue()


def write_frame(fd: int, payload: bytes) -> None:
    """Write one frame, looping over partial writes (pipes take at most 64 KiB at a time)."""
    view = memoryview(_HEADER.pack(len(payload)) + payload)
    with _writing:
        while view:
            written = os.write(fd, view)
            view = view[written:]


def send(fd: int, obj) -> None:
    write_frame(fd, dumps(obj))


def read_exact(fd: int, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError("the other end closed the pipe mid-message")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def receive_frame(fd: int) -> bytes:
    """Blocking read of one frame (used on the rank side); EOFError when the launcher closed."""
    header = os.read(fd, _HEADER.size)
    if not header:
        raise EOFError("the launcher closed the control pipe")
    if len(header) < _HEADER.size:
        header += read_exact(fd, _HEADER.size - len(header))
    (size,) = _HEADER.unpack(header)
    return read_exact(fd, size)


def receive(fd: int):
    return pickle.loads(receive_frame(fd))


class FrameBuffer:
    """Collects bytes read without blocking and yields whole frames as they complete."""

    def __init__(self):
        self._data = bytearray()

    def feed(self, chunk: bytes) -> list:
        self._data += chunk
        frames = []
        while len(self._data) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(self._data)
            end = _HEADER.size + size
            if len(self._data) < end:
                break
            frames.append(bytes(self._data[_HEADER.size:end]))
            del self._data[:end]
        return frames
