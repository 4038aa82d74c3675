"""Training: one loop for single-device, DataParallel and DDP runs, and what it needs.

Uses the runtime (env, launch); never imports the lessons' topics, graders or authoring.

    data               the course's one dataset: small, synthetic, deterministic
    models             the course's one model, and deliberately broken variants
    dp                 DataParallel's flow (scatter, replicate, parallel_apply, gather), also on CPU
    strategies         single, DP and DDP: how the loop wraps the model and syncs gradients
    amp                mixed precision: autocast and the fp16 GradScaler
    loading            a DistributedSampler per rank, resumable mid-epoch
    measure            time per phase of a step, peak memory per device
    timeline_recorder  every rank's phases and bucket all-reduces of a few steps, on one clock
    checkpoint         atomic saves of the full state, exact resume, weights_only loading
    trainers           TrainConfig in, History out: the loop itself
    train_cli          `python -m course_lib train`, plainly, with --nprocs or under torchrun
"""
