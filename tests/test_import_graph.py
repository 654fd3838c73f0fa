"""The package's import graph, imports inside functions included (they are how circles
used to stay importable): no module reaches itself, and arrows go up the written layer
order only, core -> comm -> emulator -> algorithms -> cost models -> runtime -> bench ->
viz -> exercises. An arrow against the order that has to stay for a while is listed in
KNOWN, with why (none is now); a new one fails, and so does a listed one that is gone
(take it off the list). Inside viz, the plots never import the widgets that run work
(ddnb.viz.widgets) nor what starts processes (runtime, testing, bench)."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = [   # (layer, module prefixes); the longest prefix decides a module's layer
    ("core", ["ddnb._checks", "ddnb.trace", "ddnb.compat", "ddnb.data", "ddnb.models", "ddnb.memory", "ddnb.flops"]),
    ("comm", ["ddnb.collectives", "ddnb.process_grid"]),
    ("emulator", ["ddnb.emulate", "ddnb.timing"]),
    ("algorithms", ["ddnb.data_parallel", "ddnb.parameter_server", "ddnb.decentralized", "ddnb.pipeline_parallel",
                    "ddnb.tensor_parallel", "ddnb.context_parallel", "ddnb.expert_parallel", "ddnb.sharding",
                    "ddnb.compression", "ddnb.data_pipeline", "ddnb.tasks", "ddnb.search", "ddnb.throughput",
                    "ddnb.grid4d"]),
    ("cost", ["ddnb.cost"]),
    ("runtime", ["ddnb.runtime", "ddnb.testing", "ddnb.launch", "ddnb.elastic"]),
    ("bench", ["ddnb.bench", "ddnb.memory_timeline"]),   # memory_timeline runs pipelines and ZeRO on workers
    ("viz", ["ddnb.viz"]),
    ("exercises", ["ddnb.exercises", "ddnb.__main__", "ddnb"]),
]
KNOWN: dict[tuple[str, str], str] = {   # (importer, imported): why it still points up; none since #28
    # ("ddnb.some.algorithm", "ddnb.testing"): "a harness that starts a World: belongs in bench",
}


def modules() -> dict[str, Path]:
    out = {}
    for path in (ROOT / "ddnb").rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    edges = {m: set() for m in mods}
    for m, path in mods.items():
        package = m if path.name == "__init__.py" else m.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for t in targets:
                t = resolve(t) if t.startswith("ddnb") else None
                if t and t != m:
                    edges[m].add(t)
    return edges


def layer(module: str) -> int:
    best = max(((i, len(p)) for i, (_, prefixes) in enumerate(LAYERS) for p in prefixes
                if module == p or module.startswith(p + ".")), key=lambda x: x[1])
    return best[0]


def test_no_module_reaches_itself():
    edges, state, cycles = graph(), {}, []

    def visit(m, path):
        state[m] = "open"
        for t in sorted(edges[m]):
            if state.get(t) == "open":
                cycles.append(path[path.index(t):] + [t])
            elif t not in state:
                visit(t, path + [t])
        state[m] = "done"

    for m in sorted(edges):
        if m not in state:
            visit(m, [m])
    assert not cycles, "import circles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_arrows_go_up_the_layer_order():
    edges = graph()
    up = {(m, t) for m, ts in edges.items() for t in ts if layer(t) > layer(m)}
    new = sorted(up - set(KNOWN))
    assert not new, "imports against the layer order:\n" + "\n".join(
        f"{m} ({LAYERS[layer(m)][0]}) -> {t} ({LAYERS[layer(t)][0]})" for m, t in new)
    assert not set(KNOWN) - up, f"gone, take them off KNOWN: {sorted(set(KNOWN) - up)}"


def test_the_graph_sees_imports_inside_functions():
    edges = graph()
    assert {"ddnb.collectives.p2p", "ddnb.emulate.compute"} <= edges["ddnb.emulate.session"]   # both in functions
    assert "ddnb.collectives.devices" in edges["ddnb.runtime.worker"]  # local, to keep torch out of its import
    assert not any(t.startswith("ddnb.emulate") for t in edges["ddnb.collectives.p2p"])   # the transport is plugged in


def test_viz_plots_import_no_widget_and_start_nothing():
    """ddnb.viz.widgets falls in the viz layer by the prefix ddnb.viz, ddnb.runtime.world in
    the runtime layer beside ddnb.testing. No module of ddnb.viz outside ddnb.viz.widgets
    imports a widget (only the package's __init__ re-exports a few), and none of them
    imports the layers that start processes: runtime (ddnb.runtime, ddnb.testing, ...) and
    bench (ddnb.bench, ...)."""
    assert LAYERS[layer("ddnb.viz.widgets.moe")][0] == LAYERS[layer("ddnb.viz.widgets")][0] == "viz"
    assert LAYERS[layer("ddnb.runtime.world")][0] == LAYERS[layer("ddnb.testing")][0] == "runtime"
    edges = graph()
    widget = lambda m: m == "ddnb.viz.widgets" or m.startswith("ddnb.viz.widgets.")   # noqa: E731
    plots = [m for m in edges if (m == "ddnb.viz" or m.startswith("ddnb.viz.")) and not widget(m)]
    assert "ddnb.viz.memory" in plots and "ddnb.viz.widgets.moe" in edges
    starts = {i for i, (name, _) in enumerate(LAYERS) if name in ("runtime", "bench")}
    assert {layer("ddnb.testing"), layer("ddnb.runtime.cluster"), layer("ddnb.bench.dp")} <= starts
    bad = sorted((m, t) for m in plots for t in edges[m] if (widget(t) and m != "ddnb.viz") or layer(t) in starts)
    assert not bad, "plotting modules that import widgets or start processes:\n" + "\n".join(
        f"{m} -> {t}" for m, t in bad)
