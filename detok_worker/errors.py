"""The base of every error whose message is the whole story for an operator: the CLI prints it on one line
(no traceback) and exits 1. Each package defines its own subclasses next to the code that raises them."""


class OperatorError(Exception):
    """A failure caused by the environment or the input (a bad file, a busy port, a wrong tokenizer), not a bug."""
