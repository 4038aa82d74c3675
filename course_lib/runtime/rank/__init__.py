"""Inside each rank's process; never imports the launcher's side.

    main            set up one rank, run its job, report back, exit (a spawned rank starts here)
    collective_log  the collectives this rank issued (torch's flight recorder), sent when asked
    session_loop    SessionLoop: a session's rank keeps a namespace and serves commands until closed
    own_rendezvous  the user's own init_process_group in a rank: its address, a port in use
    detach          a forked rank lets go of the notebook kernel: its own pipes, no ZMQ, no IPython
    script_end      a torchrun script's end_process_group(): gloo's threads end before Python exits
"""
