"""Small constructors for INPUT_TYPES entries, in ComfyUI's own shapes: ``Int(8, 1, 4096, "tip")`` is
``("INT", {"default": 8, "min": 1, "max": 4096, "tooltip": "tip"})``. The option keys keep ComfyUI's
order (the page gets them as written)."""
from __future__ import annotations


def Int(default, lo, hi, tip=None, step=None):
    """An INT widget from lo to hi (without tip: none, as ComfyUI's own core nodes)."""
    opts = {"default": default, "min": lo, "max": hi}
    if step is not None:
        opts["step"] = step
    if tip is not None:
        opts["tooltip"] = tip
    return ("INT", opts)


def Float(default, lo, hi, step, tip=None, round=None):  # noqa: A002 - ComfyUI's option name
    """A FLOAT widget from lo to hi in steps of step; round=False keeps the typed value as it is."""
    opts = {"default": default, "min": lo, "max": hi, "step": step}
    if round is not None:
        opts["round"] = round
    if tip is not None:
        opts["tooltip"] = tip
    return ("FLOAT", opts)


def Choice(options, default, tip):
    """A combo widget of options."""
    return (options, {"default": default, "tooltip": tip})


def Bool(default, tip):
    return ("BOOLEAN", {"default": default, "tooltip": tip})


def Text(default, tip, multiline=False):
    """A STRING widget; multiline for a text box."""
    return ("STRING", {"multiline": True, "default": default, "tooltip": tip} if multiline
            else {"default": default, "tooltip": tip})


def outputs(*outs):
    """RETURN_TYPES, RETURN_NAMES and OUTPUT_TOOLTIPS from one (type, name, tooltip) per output, so
    each output is said in one place:
    ``RETURN_TYPES, RETURN_NAMES, OUTPUT_TOOLTIPS = outputs((TENSOR, "tensor", "A TENSOR."))``."""
    return tuple(zip(*outs)) if outs else ((), (), ())
