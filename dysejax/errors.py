"""User-facing errors: each carries one line that names the problem and the fix.

The CLI prints `error: <message>` for these and exits with status 2; anything else is a bug.
"""


class UserError(Exception):
    """A mistake in the user's input (config, data, checkpoint, flags), not a bug."""


class ConfigError(UserError):
    """The configuration is invalid."""


class DataError(UserError):
    """The data source cannot be read or used as configured."""


class CheckpointError(UserError):
    """A checkpoint is unreadable or does not match the configured model."""


class PlanError(UserError):
    """A strategy plan cannot serve the model, mesh or shapes it is asked to."""


class TrainingError(Exception):
    """Training cannot go on (e.g. a non-finite loss under train.nonfinite=stop); exit status 1."""
