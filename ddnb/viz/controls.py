"""The one way a ddnb widget takes values from code as if its controls had moved:
`set_controls(widget, values)` names unknown controls and refused values in the widget's
status line instead of raising (a slider must not leave a traceback), and sets every value
before the widget recomputes once. Used by the calculators of
`notebooks/01_why_distributed.ipynb` and `notebooks/16_capstone.ipynb`.
"""
from __future__ import annotations


def set_controls(widget, values: dict) -> bool:
    """Set `widget.controls[k].value = v` for each of `values`, with `widget._setting` True
    meanwhile (its observers then skip recomputing); False, with the reason in
    `widget.status.value`, for an unknown control or a value a control refuses."""
    unknown = sorted(set(values) - set(widget.controls))
    if unknown:
        widget.status.value = f"unknown controls {unknown}; known: {list(widget.controls)}"
        return False
    widget._setting = True                  # set all the values, then compute once
    try:
        for k, v in values.items():
            widget.controls[k].value = v
    except Exception as e:  # noqa: BLE001 - a value the control refuses (a trait error)
        widget.status.value = f"{type(e).__name__}: {e}"
        return False
    finally:
        widget._setting = False
    return True
