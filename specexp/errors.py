"""The one exception type for bad user input."""


class ConfigError(ValueError):
    """A bad input the user can fix: the message is one line naming the value and what would be valid.

    The CLI prints it as ``specexp: error: <message>`` and exits with status 2, without a traceback.
    """
