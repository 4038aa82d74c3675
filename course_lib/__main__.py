"""`python -m course_lib COMMAND`: one entry point for learners, instructors and maintainers."""
import importlib
import sys

# command -> (module, function, one-line help); each function takes argv and returns an exit code.
COMMANDS = {
    "doctor": ("course_lib.runtime.launcher.doctor", "main", "check this machine can run the course"),
    "train": ("course_lib.training.train_cli", "main", "train the course model (plainly or under torchrun)"),
    "build-lessons": ("course_lib.authoring.commands", "build_lessons_main", "write lessons/ from solutions/"),
    "check": ("course_lib.authoring.commands", "check_main", "grade your lesson NN's exercises"),
    "run-solutions": ("course_lib.authoring.commands", "run_solutions_main", "execute the solution notebooks"),
    "pacing": ("course_lib.authoring.commands", "pacing_main", "each lesson's minutes, from the pacing model"),
}


def usage() -> str:
    lines = ["usage: python -m course_lib COMMAND [options]", "", "commands:"]
    lines += [f"  {name:<14} {help_}" for name, (_, _, help_) in COMMANDS.items()]
    lines += ["", "Run `python -m course_lib COMMAND --help` for a command's options."]
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module, function, _ = COMMANDS[name]
    return int(getattr(importlib.import_module(module), function)(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
