"""What runs first inside a grading sandbox, before anything of the learner's: the limits set, root's
uid dropped, the submission copied into the private folder, then a module (pytest) in this process.

Started by sandbox.py as `python -I -m course_lib.authoring.sandbox_entry ... -- MODULE ARGS`.
"""
import argparse
import ctypes
import os
import resource
import runpy
import shutil
import stat
import sys

PR_SET_DUMPABLE = 4
RESULT = "{result}"  # in MODULE's arguments: a path to a file only this process can open
MAX_RECORD_BYTES = 256 * 2**20  # checks.engine.record_file's limit: a bigger record is not copied


def main(argv=None) -> int:
    args, module_argv = _parse(sys.argv[1:] if argv is None else argv)
    _set_limits(args)
    if os.getuid() == 0:  # bwrap ran as root, without a user namespace: become nobody in particular
        _become(args.uid, args.folders)
    _prctl(PR_SET_DUMPABLE, 0)  # no process of the learner's may trace this one or open its fds
    for folder in args.make:
        os.makedirs(folder, exist_ok=True)
    _copy_inputs(args.inputs, args.folders[0])
    os.chdir(args.folders[0])
    result = os.memfd_create("result", os.MFD_CLOEXEC) if args.result_fd is not None else None
    module, *arguments = module_argv
    arguments = [a.replace(RESULT, f"/proc/self/fd/{result}") for a in arguments]
    code = _run_module(module, arguments)
    if result is not None:
        os.lseek(result, 0, os.SEEK_SET)
        with os.fdopen(args.result_fd, "wb", closefd=False) as out, \
                os.fdopen(result, "rb") as written:
            shutil.copyfileobj(written, out)
    if args.record_fd is not None:
        _copy_record(args.record, args.record_fd)
    return code


def _parse(argv):
    parser = argparse.ArgumentParser(prog="sandbox_entry")
    parser.add_argument("--uid", type=int, required=True)
    parser.add_argument("--memory", type=int, required=True)
    parser.add_argument("--cpu", type=int, required=True)
    parser.add_argument("--processes", type=int, required=True)
    parser.add_argument("--file-bytes", type=int, required=True)
    parser.add_argument("--inputs", required=True)
    parser.add_argument("--folder", dest="folders", action="append", required=True,
                        help="the private folder first, then the other writable ones")
    parser.add_argument("--make", action="append", default=[])
    parser.add_argument("--result-fd", type=int)
    parser.add_argument("--record", help="a file the module's kernel writes, copied to --record-fd")
    parser.add_argument("--record-fd", type=int)
    split = argv.index("--")
    return parser.parse_args(argv[:split]), argv[split + 1:]


def _set_limits(args) -> None:
    """Each limit's soft and hard value the same, so the learner cannot raise it (CPU: SIGXCPU
    first, SIGKILL 5 s later)."""
    for which, value in ((resource.RLIMIT_DATA, args.memory),
                         (resource.RLIMIT_CPU, (args.cpu, args.cpu + 5)),
                         (resource.RLIMIT_NPROC, args.processes),
                         (resource.RLIMIT_FSIZE, args.file_bytes), (resource.RLIMIT_CORE, 0)):
        soft, hard = value if isinstance(value, tuple) else (value, value)
        resource.setrlimit(which, (soft, hard))


def _become(uid: int, folders) -> None:
    for folder in folders:
        os.chown(folder, uid, uid)
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    with open("/proc/self/status") as status:  # a uid change from 0 clears every capability
        held = [line for line in status if line.startswith(("CapEff", "CapPrm", "CapAmb"))]
    if any(int(line.split()[1], 16) for line in held) or os.getuid() != uid:
        raise SystemExit(f"sandbox: could not drop root ({''.join(held)}); not grading")


def _prctl(option: int, value: int) -> None:
    if ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) != 0:
        raise SystemExit(f"sandbox: prctl({option}) failed: {os.strerror(ctypes.get_errno())}")


def _copy_inputs(inputs: str, folder: str) -> None:
    for name in sorted(os.listdir(inputs)):
        shutil.copy(os.path.join(inputs, name), os.path.join(folder, name))


def _copy_record(path: str, fd: int) -> None:
    """The checks' record (checks/engine/record.py), if the kernel left one: a regular file (no
    link, no FIFO to block on) of at most MAX_RECORD_BYTES, else nothing; the judge reads it."""
    try:
        source = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return
    with os.fdopen(source, "rb") as record, os.fdopen(fd, "wb", closefd=False) as out:
        if stat.S_ISREG(os.fstat(source).st_mode):
            out.write(record.read(MAX_RECORD_BYTES + 1))


def _run_module(module: str, arguments) -> int:
    sys.argv = [module, *arguments]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exit:
        return exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
