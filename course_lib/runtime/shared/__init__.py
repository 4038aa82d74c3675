"""What the launcher and its ranks both use; imports nothing of launcher/ or rank/:

    protocol      the rank's spec and pipes, the message kinds, the one error record
    channel       length-prefixed cloudpickle messages over pipes
    env           where and how ranks run: backend, device, start method, threads, seeding
    errors        DistributedRunError: one failure per rank, gathered into one exception
    output        each rank's output relayed to the caller as whole lines labelled [rankN]
    live_line     output's progress bars: one line redrawn in place, in a notebook or a terminal
    tracebacks    rank tracebacks and stack dumps, the learner's frames first
    process_group signal a process and everything it started
"""
