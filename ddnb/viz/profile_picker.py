"""A widget that chooses the emulated cluster's profile (`ddnb.emulate`): one of the named
ones (10 GbE, InfiniBand with NVLink inside a node, one NVLink node) or a custom one from
its latency alpha, bandwidth, peak FLOP/s and slowdown.

    picker = ProfilePicker("ib", slowdown=3000)
    picker                          # the menu and the sliders
    Cluster(n=8, emulate=picker.profile)

Choosing a named profile sets the sliders to its inter-host link and device; moving a
slider makes the profile "custom" (one link everywhere, one rank per host, as
`ddnb.emulate.custom`). `on_change(fn)` calls fn(profile) after each change, so that a
notebook can re-run a measurement. Taught in `notebooks/12_scalability.ipynb`.
"""
from __future__ import annotations

import ipywidgets as widgets
from IPython.display import display

from ddnb.emulate import PROFILES, custom, get_profile

NAMES = {"10 GbE (T4 nodes)": "10gbe", "InfiniBand HDR + NVLink (DGX A100)": "ib",
         "NVLink (one H100 node)": "nvlink", "custom": "custom"}


class ProfilePicker:
    """A dropdown of profiles and four log sliders: alpha (us), bandwidth (GB/s), peak
    (TFLOP/s) and slowdown (real seconds per emulated second)."""

    def __init__(self, name: str = "ib", slowdown: float | None = None):
        get_profile(name)   # an unknown name is a ValueError now, not a broken widget
        self._callbacks = []
        self._quiet = False
        label = next(k for k, v in NAMES.items() if v == name)
        self.menu = widgets.Dropdown(options=list(NAMES), value=label, description="profile")
        style = dict(continuous_update=False, readout_format=".3g")
        self.alpha = widgets.FloatLogSlider(base=10, min=-7, max=-3, description="alpha (s)", **style)
        self.bandwidth = widgets.FloatLogSlider(base=10, min=-1, max=3, description="GB/s", **style)
        self.peak = widgets.FloatLogSlider(base=10, min=0, max=3, description="TFLOP/s", **style)
        self.slowdown = widgets.FloatLogSlider(base=10, min=0, max=4, description="slowdown", **style)
        self.status = widgets.Label()
        self._named(name, slowdown)
        self.menu.observe(lambda ch: self._named(NAMES[ch["new"]], None), names="value")
        for s in (self.alpha, self.bandwidth, self.peak, self.slowdown):
            s.observe(lambda ch: self._moved(), names="value")
        self.widget = widgets.VBox([self.menu, self.alpha, self.bandwidth, self.peak, self.slowdown, self.status])

    def _named(self, name: str, slowdown: float | None) -> None:
        if name == "custom":
            self._moved()
            return
        p = PROFILES[name]
        self._quiet = True
        try:
            self.alpha.value, self.bandwidth.value = p.inter.alpha, p.inter.bandwidth / 1e9
            self.peak.value = p.peak_flops / 1e12
            self.slowdown.value = p.slowdown if slowdown is None else slowdown
        finally:
            self._quiet = False
        self._profile = p.with_(slowdown=float(self.slowdown.value))
        self._changed()

    def _moved(self) -> None:
        if self._quiet:
            return
        self._profile = custom(alpha=float(self.alpha.value), bandwidth=float(self.bandwidth.value) * 1e9,
                               peak_flops=float(self.peak.value) * 1e12, slowdown=float(self.slowdown.value))
        if self.menu.value != "custom":
            self._quiet = True
            self.menu.value = "custom"
            self._quiet = False
        self._changed()

    def _changed(self) -> None:
        self.status.value = str(self._profile)
        for fn in self._callbacks:
            fn(self._profile)

    @property
    def profile(self):
        """The chosen `ddnb.emulate.Profile`."""
        return self._profile

    def on_change(self, fn) -> None:
        """Call fn(profile) after every change of the menu or a slider."""
        self._callbacks.append(fn)

    def _ipython_display_(self):
        display(self.widget)
