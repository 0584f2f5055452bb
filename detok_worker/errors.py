"""The base of every error whose message is the whole story for an operator: the CLI prints it on one line
(no traceback) and exits 1. Each package defines its own subclasses next to the code that raises them."""


class OperatorError(Exception):
    """A failure caused by the environment or the input (a bad file, a busy port, a wrong tokenizer), not a bug."""


class ParameterError(ValueError):
    """A client's request parameter that cannot be used: out of range, or not one the engine can honour. `param` is
    the request field at fault (the 400 names it; an engine's Reject carries it), where there is one."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param
