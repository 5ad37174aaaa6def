"""The package's one exception type."""
from __future__ import annotations


class AnyDeviceError(ValueError):
    """Bad input or an unusable backend.

    The message always names the operation (or node), the argument and the value, e.g.
    ``conv2d: argument 'stride' = (0, 1): must be positive``. It subclasses ValueError so
    callers that catch ValueError keep working.
    """

    def __init__(self, op: str, arg: str | None = None, value=None, reason: str = ""):
        self.op, self.arg, self.value, self.reason = op, arg, value, reason
        if arg is None:
            msg = f"{op}: {reason}"
        else:
            msg = f"{op}: argument '{arg}' = {_short(value)}: {reason}"
        super().__init__(msg)


def _short(value) -> str:
    shape = getattr(value, "shape", None)
    if shape is not None and not isinstance(value, (int, float)):
        return f"<tensor of shape {tuple(shape)}>"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
