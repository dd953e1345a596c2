"""What a run computes: learning tasks, delay models, per-process setup, the PS's aggregator."""
