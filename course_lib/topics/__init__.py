"""What the lessons demonstrate, one concept a module; the trainer never imports these.

    collectives   naive and ring all-reduce from point-to-point sends        (lesson 03)
    traffic       count the bytes a rank sends and the collectives it calls  (lesson 03)
    cost_model    the alpha-beta model, bus bandwidth, fitting measurements   (lessons 03, 09, 12)
    timing        honest timing: warm-up, GPU sync, medians                   (lessons 01, 09, 10)
    accumulation  gradient accumulation with DDP's no_sync                    (lesson 05)
    crash_safety  a save that crashes half way, to see what survives          (lesson 07)
    scaling       speedup, efficiency, Amdahl, step-time model, batch plans   (lesson 09)
    input_pipeline  a slow dataset, precomputed features, a prefetcher        (lesson 10)
    timeline      draw a step's timeline, its overlap, Perfetto export        (lessons 04, 10)
    memory        per-rank memory estimator and its measured counterpart      (lesson 11)
    planning      a transformer's shape and a parallel recipe (dp, tp, pp, ZeRO, checkpointing,
                  offload): what one GPU holds                                  (lesson 21)
    step_time     a step's time under a recipe on a stated cluster; the search for a plan (lesson 21)
    plan_measured tensor-parallel layers trained a step, counted, against the planner (lesson 21)
    cluster       node layouts, torchrun command lines, SLURM, local "nodes"  (lesson 12)
    pitfalls      the clinic's broken snippets next to their fixes            (lesson 08)
    debugging     broken runs next to their fixes; the flight recorder's dumps  (lesson 13)
    from_scratch  DDP (overlap, buckets), ZeRO-1 and FSDP from hooks and collectives (lessons 15, 16);
                  tensor and sequence parallelism (lesson 17); pipeline stages and schedules (lesson 18)
                  activation checkpointing and a mixed-precision FSDP unit (lesson 19)
                  FSDP x TP on a 2-D mesh (lesson 20)
"""
