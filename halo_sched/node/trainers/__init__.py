"""Trainer-side programs halo-sched ships and runs on the nodes in place of a job's trainer.

Each module here is self-contained (the standard library, and torch imported only inside
``main()``): it travels to the nodes as its own source text, so it cannot rely on halo-sched
being installed there, and importing it here never imports torch.
"""
