"""The engine every backend shares: the training loop (`trainer`), portable checkpoints (`checkpoint`), input
prefetch (`prefetch`), preemption (`preemption`), the learning-rate schedule (`schedule`) and the run's logs
(`run_log`)."""
