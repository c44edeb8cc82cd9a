"""dysejax: a JAX trainer that picks the parallel strategy per sequence-length bucket.

Notebook API::

    import dysejax
    config = dysejax.load_config("configs/tiny.yaml", overrides=["train.steps=20"])
    trainer = dysejax.Trainer(config, workdir="runs/nb")
    rows = trainer.fit(steps=20)
"""
from dysejax.config import Config, load_config
from dysejax.errors import CheckpointError, ConfigError, DataError, PlanError, TrainingError, UserError


def __getattr__(name):
    # Trainer imports jax and the model; keep `import dysejax` + load_config light, so the
    # host-device count can still be chosen before JAX starts its backend.
    if name == "Trainer":
        from dysejax.trainer import Trainer
        return Trainer
    raise AttributeError(name)


__all__ = ["Config", "load_config", "Trainer", "UserError", "ConfigError", "DataError",
           "CheckpointError", "PlanError", "TrainingError"]
