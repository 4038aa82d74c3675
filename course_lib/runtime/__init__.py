"""The runtime: start ranks from a notebook or a script, talk to them, stop them all.

Imports nothing else of course_lib. Its folders say where the code runs:

    shared/    both sides: imports neither of the others (tests/test_layout.py checks the roles)
    launcher/  the caller's process (a notebook's kernel, a script): imports shared/, and rank/ for
               the code a forked child runs and the jobs it sends
    rank/      inside each rank's process: imports shared/, never launcher/
"""
