"""The caller's side (a notebook's kernel or a script): start ranks, watch them, stop them all.

    launch        launch(fn, ...): run a function on N local processes, return their results
    spawn         spawn(fn, args, nprocs): torch.multiprocessing.spawn's call, fn(rank, *args)
    supervisor    RankSupervisor: start the ranks, relay their output, collect replies, stop them all
    diagnosis     why ranks hang: the first place their recorded collectives part
    starter       start one rank's process by fork or spawn, with its pipes
    store         the TCPStore the launcher hosts on loopback, where the ranks meet
    session       DistributedSession: ranks that stay alive between cells
    magic         %%distributed: a cell run on every rank of a session
    doctor        `python -m course_lib doctor`: can this machine run the course, and how
"""
