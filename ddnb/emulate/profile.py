"""Profiles of the hardware an emulated cluster stands for: devices, links, hosts, and how
much slower than real time it runs.

A profile holds what the emulator charges for (`ddnb.emulate`):

- a device: peak FLOP/s and the fraction of it that training reaches (model FLOPs
  utilization, MFU; Chowdhery et al. 2022, "PaLM", Sec. 4.1 and Appendix B), and its
  memory bandwidth, so an operation takes max(FLOPs / (peak x MFU), bytes / bandwidth)
  (the roofline model: Williams, Waterman & Patterson, "Roofline", CACM 2009);
- two kinds of link, each with a latency alpha and a bandwidth (Hockney's model,
  t = alpha + n / B; Hockney, Parallel Computing 1994): `intra` between ranks on one
  host (NVLink) and `inter` between hosts (a NIC: Ethernet or InfiniBand);
- `ranks_per_host`: ranks r and s share a host when r // ranks_per_host == s // ranks_per_host;
- `shared_nic`: the ranks of a host share one inter-host link (one NIC per host, in each
  direction), so their messages to other hosts queue on it (`ddnb.emulate.nic`); False:
  each rank has its own (a DGX node's one NIC per GPU);
- `slowdown`: real seconds per emulated second (time dilation), so that the real work of
  many workers on a few cores fits inside the time the model gives it;
- `op_overhead`: seconds added to every charged operation, a GPU kernel's launch cost
  (a few us; 0 in the named profiles, whose lessons do not turn on it). It is what makes
  many small operations (a compression hook's) cost time on a fast device.

Figures are per direction, float32 peaks (ddnb trains in float32). Sources per profile.
Taught in `notebooks/05_allreduce.ipynb` (links) and `notebooks/09_pipeline_parallelism.ipynb`
(devices).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from ddnb._checks import Checks


@dataclass(frozen=True)
class Link:
    """A link of Hockney's model, the one hardware type of ddnb (the emulator's links and the
    cost models' networks, `ddnb.cost.scaling`): alpha, seconds of latency per message;
    bandwidth, bytes per second in one direction; an optional name for tables."""

    alpha: float
    bandwidth: float
    name: str = ""

    @property
    def beta(self) -> float:
        """Seconds per byte: 1 / bandwidth."""
        return 1.0 / self.bandwidth

    def time(self, nbytes: int) -> float:
        """alpha + n / B: seconds for one message of `nbytes`."""
        return self.alpha + nbytes / self.bandwidth


@dataclass(frozen=True)
class Profile:
    """An emulated cluster. Build a custom one with keywords, or start from a named one:
    `get_profile("ib").with_(slowdown=500)`."""

    name: str
    peak_flops: float          # FLOP/s of one device (float32)
    efficiency: float          # MFU: the fraction of peak that training reaches, in (0, 1]
    memory_bandwidth: float    # bytes/s of device memory
    intra: Link                # between ranks on one host
    inter: Link                # between hosts
    ranks_per_host: int = 1
    slowdown: float = 100.0    # real seconds per emulated second
    source: str = ""
    op_overhead: float = 0.0   # seconds per charged operation (kernel launch)
    shared_nic: bool = False   # the ranks of a host share one inter-host link

    def __post_init__(self):
        check_profile(self)

    def host(self, rank: int) -> int:
        return rank // self.ranks_per_host

    def link(self, a: int, b: int) -> Link:
        """The link a message from rank a to rank b takes."""
        return self.intra if self.host(a) == self.host(b) else self.inter

    def compute_time(self, flops: float, nbytes: float = 0.0) -> float:
        """Emulated seconds of one operation: the roofline max(FLOPs / (peak x MFU),
        bytes / memory bandwidth), plus `op_overhead`."""
        return max(flops / (self.peak_flops * self.efficiency), nbytes / self.memory_bandwidth) + self.op_overhead

    def with_(self, **changes) -> "Profile":
        """A copy with some fields changed (checked again): with_(slowdown=500)."""
        if "alpha" in changes or "bandwidth" in changes:   # one flat link, as custom() makes
            link = Link(changes.pop("alpha", self.inter.alpha), changes.pop("bandwidth", self.inter.bandwidth))
            changes.setdefault("intra", link)
            changes.setdefault("inter", link)
        return replace(self, **changes)

    def to_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict) -> "Profile":
        d = dict(d)
        d["intra"], d["inter"] = Link(**d["intra"]), Link(**d["inter"])
        return Profile(**d)

    def __str__(self) -> str:
        def link(k: Link) -> str:
            return f"alpha {k.alpha * 1e6:g} us, {k.bandwidth / 1e9:g} GB/s"
        hosts = (f"{self.ranks_per_host} ranks per host: intra {link(self.intra)}; inter {link(self.inter)}"
                 + (" (one NIC per host, shared)" if self.shared_nic else "")
                 if self.ranks_per_host > 1 else f"one rank per host, {link(self.inter)}")
        return (f"emulated '{self.name}': {self.peak_flops / 1e12:g} TFLOP/s x {self.efficiency:g} MFU, "
                f"{self.memory_bandwidth / 1e9:g} GB/s memory"
                + (f", {self.op_overhead * 1e6:g} us per operation" if self.op_overhead else "")
                + f"; {hosts}; slowdown {self.slowdown:g}x")


def check_profile(p: Profile) -> None:
    """ValueError naming every bad field of `p`."""
    with Checks(f"profile {p.name!r}") as check:
        check.rule(isinstance(p.name, str) and p.name != "", f"name={p.name!r}: need a non-empty string")
        check.number("peak_flops", p.peak_flops, positive=True, why=" (FLOP/s)")
        check.number("efficiency", p.efficiency, positive=True, max=1, why=" (MFU)")
        check.number("memory_bandwidth", p.memory_bandwidth, positive=True, why=" (bytes/s)")
        for side in ("intra", "inter"):
            link = getattr(p, side)
            if check.rule(isinstance(link, Link), f"{side}={link!r}: need a Link(alpha, bandwidth)"):
                check.number(f"{side}.alpha", link.alpha, min=0, why=" (seconds)")
                check.number(f"{side}.bandwidth", link.bandwidth, positive=True, why=" (bytes/s)")
        check.integer("ranks_per_host", p.ranks_per_host, min=1)
        check.rule(isinstance(p.shared_nic, bool), f"shared_nic={p.shared_nic!r}: need True or False")
        check.number("slowdown", p.slowdown, positive=True, why=" (real seconds per emulated second)")
        check.number("op_overhead", p.op_overhead, min=0, why=" (seconds per operation)")


def custom(alpha: float, bandwidth: float, peak_flops: float = 10e12, efficiency: float = 0.5,
           memory_bandwidth: float = 1e12, slowdown: float = 100.0, name: str = "custom") -> Profile:
    """A flat cluster: one rank per host, every link alpha + n / bandwidth."""
    link = Link(alpha, bandwidth)
    return Profile(name, peak_flops, efficiency, memory_bandwidth, link, link, 1, slowdown,
                   source="custom")


# Named profiles. Each figure is a vendor's peak or a published measurement (per direction).
PROFILES = {
    # A commodity cluster: one NVIDIA T4 per node, 10 Gigabit Ethernet between nodes.
    "10gbe": Profile(
        "10gbe", peak_flops=8.1e12, efficiency=0.4, memory_bandwidth=320e9,
        intra=Link(50e-6, 1.25e9), inter=Link(50e-6, 1.25e9), ranks_per_host=1, slowdown=20.0,
        source="NVIDIA T4 datasheet (8.1 TFLOP/s fp32, 320 GB/s GDDR6); 10 GbE = 1.25 GB/s; "
               "latency 50 us assumed: kernel TCP over 10 GbE takes tens of us one way"),
    # A GPU cluster: DGX A100 nodes of 8, NVLink 3 within, InfiniBand HDR (200 Gb/s) between.
    "ib": Profile(
        "ib", peak_flops=19.5e12, efficiency=0.4, memory_bandwidth=1.555e12,
        intra=Link(3e-6, 300e9), inter=Link(5e-6, 25e9), ranks_per_host=8, slowdown=500.0,
        source="NVIDIA A100 datasheet (19.5 TFLOP/s fp32, 1.555 TB/s HBM2, NVLink 600 GB/s both "
               "directions = 300 GB/s each); HDR InfiniBand 200 Gb/s = 25 GB/s per NIC; latencies assumed "
               "(a few us: the order of NCCL's per-step latencies)"),
    # One node: 8 NVIDIA H100 SXM joined by NVLink 4.
    "nvlink": Profile(
        "nvlink", peak_flops=67e12, efficiency=0.4, memory_bandwidth=3.35e12,
        intra=Link(3e-6, 450e9), inter=Link(3e-6, 450e9), ranks_per_host=8, slowdown=2000.0,
        source="NVIDIA H100 SXM datasheet (67 TFLOP/s fp32, 3.35 TB/s HBM3, NVLink 900 GB/s both "
               "directions = 450 GB/s each); latency 3 us assumed"),
}


def get_profile(profile) -> Profile:
    """A Profile from a name in PROFILES, a Profile, or a dict (Profile.to_dict)."""
    if isinstance(profile, Profile):
        return profile
    if isinstance(profile, dict):
        return Profile.from_dict(profile)
    if profile not in PROFILES:
        raise ValueError(f"emulate={profile!r} is not a profile: use one of {sorted(PROFILES)}, "
                         "or ddnb.emulate.custom(alpha=..., bandwidth=...)")
    return PROFILES[profile]
