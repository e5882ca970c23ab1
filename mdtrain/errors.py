"""The one exception type that means "the user asked for something we cannot do"."""


class UsageError(ValueError):
    """Bad input from the user: the CLI prints the message on one line and exits 2.

    The message says what is wrong and what to do about it, e.g.
    ``"--data /x: no such folder; pass a folder with one sub-folder per class"``.
    """
