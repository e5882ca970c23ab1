"""The one exception type that means "the user asked for something we cannot do"."""

from __future__ import annotations

USAGE_EXIT_CODE = 2  # bad input, as argparse exits: never worth a restart


class UsageError(ValueError):
    """Bad input from the user: the CLI prints the message on one line and exits 2.

    The message says what is wrong and what to do about it. An error about
    one argument (`bad_value`) names it as the library's callers know it,
    `dropout=1.0: must be in [0, 1)`; the command line shows the same error
    with its option, `--dropout 1.0: must be in [0, 1)` (`as_option`).
    """

    def __init__(self, message: str, *, argument: str | None = None, value=None, problem=""):
        super().__init__(message)
        self.argument = argument
        self.value = value
        self.problem = problem

    def as_option(self) -> str:
        """The message as the command line words it: the argument as its `--option`."""
        if self.argument is None:
            return str(self)
        return f"--{self.argument.replace('_', '-')} {self.value}: {self.problem}"


def bad_value(argument: str, value, problem: str) -> UsageError:
    """A `UsageError` about one argument: `argument=value: problem`."""
    return UsageError(
        f"{argument}={value}: {problem}", argument=argument, value=value, problem=problem
    )
