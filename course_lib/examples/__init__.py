"""Scripts the lessons run from a shell, e.g. under torchrun: `python -m course_lib.examples.NAME`."""
