"""The runtime: start ranks from a notebook or a script, talk to them, stop them all.

Imports nothing else of course_lib. The bottom modules import only each other (output uses
live_line), never the launcher or the rank side:

    env           where and how ranks run: backend, device, start method, threads, seeding
    errors        DistributedRunError: one failure per rank, gathered into one exception
    output        each rank's output relayed to the caller as whole lines labelled [rankN]
    live_line     output's progress bars: one line redrawn in place, in a notebook or a terminal
    tracebacks    rank tracebacks and stack dumps, the learner's frames first
    channel       length-prefixed cloudpickle messages over pipes

The notebook side (the caller's process):

    launch        launch(fn, ...): run a function on N local processes, return their results
    spawn         spawn(fn, args, nprocs): torch.multiprocessing.spawn's call, fn(rank, *args)
    rank_group    start the ranks, watch them, relay their output, stop them all
    rank_start    start one rank by fork or spawn, with its pipes
    rendezvous    the TCPStore the launcher hosts on loopback, where the ranks meet
    session       DistributedSession: ranks that stay alive between cells
    magic         %%distributed: a cell run on every rank of a session
    doctor        `python -m course_lib doctor`: can this machine run the course, and how

The rank side (inside each rank's process):

    rank_process  set up one rank, run its job, report back, exit
    session_rank  a session's rank: keep a namespace and serve commands until closed
    user_rendezvous  the user's own init_process_group in a rank: its address, a port in use
    rank_detach   a forked rank lets go of the notebook kernel: its own pipes, no ZMQ, no IPython
"""
