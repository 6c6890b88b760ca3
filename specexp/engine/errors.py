"""The engine's error for settings it cannot run with (re-exported by `specexp.engine.config`; here so that modules
`config` imports can raise it too)."""


class EngineConfigError(ValueError):
    """A setting the engine cannot run with; the message names the value and what would be valid."""
