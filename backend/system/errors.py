"""The package's one exception type."""
from __future__ import annotations


class AnyDeviceError(ValueError):
    """Bad input or an unusable backend.

    The message always names the operation (or node), the argument and the value, e.g.
    ``conv2d: argument 'stride' = (0, 1): must be positive``. It subclasses ValueError so
    callers that catch ValueError keep working.

    The parts stay available so a caller can say the same thing in its own words without
    rewriting the text: ``op``, ``arg``, ``value``, ``reason``; ``refs`` maps the other arguments
    the reason names (written ``{name}`` in it) to their shapes; ``alt`` is the same fault seen
    from another argument, ``(arg, value, reason)`` (e.g. ssim: the input is smaller than the
    window, or the window is larger than the input), for a caller that sets that argument itself.
    """

    #: what the message calls ``arg`` ("argument"; a node's error says "input")
    noun = "argument"

    def __init__(self, op: str, arg: str | None = None, value=None, reason: str = "", *,
                 refs: dict | None = None, alt: tuple | None = None):
        self.op, self.arg, self.value, self.reason = op, arg, value, reason
        self.refs, self.alt = dict(refs or {}), alt
        super().__init__(self.message(op, arg, value, reason))

    def message(self, op: str, arg: str | None, value, reason: str) -> str:
        """The message for these parts (``reason`` with its references filled in)."""
        reason = self.fill(reason)
        if arg is None:
            return f"{op}: {reason}"
        return f"{op}: {self.noun} '{arg}' = {short(value)}: {reason}"

    def fill(self, reason: str, names: dict | None = None) -> str:
        """``reason`` with each ``{arg}`` it refers to written as ``'name' (text)``: from ``names``
        (arg -> (name, text)) where it has the argument, else the argument's own name and shape."""
        if not self.refs:
            return reason
        names = names or {}
        return reason.format_map({a: "'{}' ({})".format(*names.get(a, (a, f"shape {tuple(shape)}")))
                                  for a, shape in self.refs.items()})


def short(value) -> str:
    """A value as an error message shows it: tensors by their shape, long text cut."""
    shape = getattr(value, "shape", None)
    if shape is not None and not isinstance(value, (int, float)):
        return f"<tensor of shape {tuple(shape)}>"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


