"""The capstone's probe, run by Python at start-up as ``sitecustomize`` in every process of the
learner's script (script_probe.install_probe copies it there): it records what the script does.

In torchrun's agent, and wherever it is imported under its own name, it does nothing: it records
only in a process whose script is COURSE_SCRIPT, into the folder COURSE_SCRIPT_PROBE.
"""
import atexit
import faulthandler
import json
import os
import signal
import sys

_DIR, _SCRIPT = os.environ.get("COURSE_SCRIPT_PROBE"), os.environ.get("COURSE_SCRIPT")

if (__name__ == "sitecustomize" and _DIR and _SCRIPT and sys.argv
        and os.path.abspath(sys.argv[0]) == _SCRIPT):
    import importlib.abc
    import importlib.util

    _RANK = os.environ.get("RANK")
    _NAME = f"{'single' if _RANK is None else 'rank' + _RANK}.{os.getpid()}"
    _RECORD = {"rank": None if _RANK is None else int(_RANK), "events": [], "autocast": {},
               "group_alive_at_exit": None, "probe_error": None}
    _STACKS = open(os.path.join(_DIR, f"stack.{_NAME}.txt"), "w")  # noqa: SIM115 - kept open
    faulthandler.register(signal.SIGUSR1, file=_STACKS, all_threads=True)  # the grader asks on a hang
    _SAVES = os.path.join(_DIR, f"saves.{_NAME}.txt")

    def _log_save(path):
        """At once, not at exit: torchrun kills a rank whose peer crashed, before its exit handlers."""
        with open(_SAVES, "a") as file:
            file.write(path + "\n")

    def _inode(target):
        """The inode of a path, a file descriptor or an open file; None if there is none."""
        try:
            if isinstance(target, int):
                return os.fstat(target).st_ino
            if hasattr(target, "fileno"):
                return os.fstat(target.fileno()).st_ino
            return os.stat(target).st_ino
        except (OSError, TypeError, ValueError):
            return None

    def _install(torch):
        import torch.nn.functional as F
        from torch.nn.parallel import DistributedDataParallel
        from torch.optim.optimizer import register_optimizer_step_post_hook
        from torch.utils.data import TensorDataset

        events, save, getitem = _RECORD["events"], torch.save, TensorDataset.__getitem__
        fsync, replace, rename = os.fsync, os.replace, os.rename
        forward, linear = DistributedDataParallel.forward, F.linear

        def probed_save(obj, f, *args, **kwargs):
            named = isinstance(f, (str, os.PathLike))
            path = os.fspath(f) if named else getattr(f, "name", "?")
            done = save(obj, f, *args, **kwargs)
            events.append(["save", os.path.realpath(path) if isinstance(path, str) else "?",
                           _inode(path if named else f)])
            _log_save(events[-1][1])
            return done

        def probed_fsync(fd):
            events.append(["fsync", _inode(fd)])
            return fsync(fd)

        def probed_rename(real):
            def rename(src, dst, *args, **kwargs):
                inode = _inode(src)
                done = real(src, dst, *args, **kwargs)
                events.append(["rename", os.path.realpath(os.fspath(dst)), inode])
                return done
            return rename

        def probed_getitem(self, index):
            if isinstance(index, int):
                events.append(["fetch", index])
            return getitem(self, index)

        def probed_forward(self, *args, **kwargs):
            if torch.is_grad_enabled():  # DDP all-reduces in this forward's backward when True
                events.append(["forward", bool(self.require_backward_grad_sync)])
            return forward(self, *args, **kwargs)

        def probed_linear(input, weight, bias=None):
            kind = input.device.type
            dtype = str(torch.get_autocast_dtype(kind)) if torch.is_autocast_enabled(kind) else "off"
            key = f"{kind}:{dtype.replace('torch.', '')}"
            _RECORD["autocast"][key] = _RECORD["autocast"].get(key, 0) + 1
            return linear(input, weight, bias)

        torch.save = torch.serialization.save = probed_save
        os.fsync, os.replace, os.rename = probed_fsync, probed_rename(replace), probed_rename(rename)
        TensorDataset.__getitem__ = probed_getitem
        DistributedDataParallel.forward = probed_forward
        F.linear = probed_linear
        register_optimizer_step_post_hook(lambda optimizer, args, kwargs: events.append(["step"]))

    class _AfterTorch(importlib.abc.MetaPathFinder):
        """Runs _install right after `import torch` finished, before the script uses it."""

        def find_spec(self, name, path=None, target=None):
            if name != "torch":
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            exec_module = spec.loader.exec_module

            def exec_then_install(module):
                exec_module(module)
                try:
                    _install(module)
                except Exception as error:  # noqa: BLE001 - an API it needs moved: say so, run on
                    _RECORD["probe_error"] = f"{type(error).__name__}: {error}"

            spec.loader.exec_module = exec_then_install
            return spec

    sys.meta_path.insert(0, _AfterTorch())

    @atexit.register  # registered first, so it runs last: after the script's own exit handlers
    def _write_record():
        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available():
            _RECORD["group_alive_at_exit"] = dist.is_initialized()
        with open(os.path.join(_DIR, f"record.{_NAME}.json"), "w") as file:
            json.dump(_RECORD, file)
