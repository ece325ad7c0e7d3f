"""Training a reward model: the recipe (`config`), the pipeline (cross-validation, final fit), the trainer, objectives
and losses, tracking (W&B) and the distributed set-up."""
