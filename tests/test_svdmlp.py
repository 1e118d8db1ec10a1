"""The package as a whole: imports flow one way between its layers (docs/architecture.md), there is no
import cycle, and the tests mirror the package."""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import svdmlp

SOURCE = Path(svdmlp.__file__).parent
TESTS = Path(__file__).parent

# docs/architecture.md, bottom up: a module may import the modules of a lower layer and of its own
# package, nothing else.
LAYERS = (
    (
        "svdmlp.activations",
        "svdmlp.arch",
        "svdmlp.ranks",
        "svdmlp.cuda_graphs",
        "svdmlp.factor_layout",
        "svdmlp.lazy",
        "svdmlp.paths",
        "svdmlp.plots",
        "svdmlp.runtime",
        "svdmlp.tables",
        "svdmlp.timing",
        "svdmlp.versions",
    ),
    ("svdmlp.decompose", "svdmlp.corpora", "svdmlp.kernels", "svdmlp.packaged"),
    ("svdmlp.config",),
    ("svdmlp.int_weights",),
    ("svdmlp.backends",),
    ("svdmlp.engine", "svdmlp.lowrank", "svdmlp.quantized_linear"),
    (
        "svdmlp.compression",
        "svdmlp.evaluate",
        "svdmlp.models",
        "svdmlp.plan",
        "svdmlp.quantize",
        "svdmlp.serving",
    ),
    ("svdmlp.checkpoint_record",),
    ("svdmlp.bench", "svdmlp.checkpoint"),
    ("svdmlp.compress_on_disk", "svdmlp.sweep"),
    ("svdmlp.cli",),
    ("svdmlp.__main__",),
)


def _module_name(path: Path) -> str:
    parts = path.relative_to(SOURCE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in SOURCE.rglob("*.py")}


def _layer(module: str) -> tuple[int, str]:
    """(layer index, the table entry that places it): the longest entry that is the module or a parent."""
    matches = [
        (index, entry)
        for index, entries in enumerate(LAYERS)
        for entry in entries
        if module == entry or module.startswith(entry + ".")
    ]
    assert matches, f"{module} is in no layer of LAYERS"
    return max(matches, key=lambda match: len(match[1]))


def _imports(module: str) -> set[str]:
    """Every svdmlp module ``module`` imports, at its top or inside a function."""
    tree = ast.parse(MODULES[module].read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    # ``from svdmlp import __version__`` names the package, which imports nothing eagerly.
    return {name for name in found if name in MODULES and name != module and name != "svdmlp"}


def test_every_import_goes_down_a_layer_or_stays_in_its_package():
    wrong = []
    for module in MODULES:
        if module == "svdmlp":
            continue
        layer, entry = _layer(module)
        for target in _imports(module):
            target_layer, target_entry = _layer(target)
            same_package = target_entry == entry or target.startswith(entry + ".")
            if not (target_layer < layer or same_package):
                wrong.append(f"{module} (layer {layer}) imports {target} (layer {target_layer})")
    assert wrong == []


# Inside svdmlp.compression, bottom up (docs/architecture.md): the same rule, a module importing only
# lower layers or its own subpackage (steps, heal), so that the steps never reach the runner, the journal
# or the workspace above them.
COMPRESSION_LAYERS = (
    ("clock", "correction", "gram", "heal", "layer_inputs", "report", "self_calibration"),
    ("heal.closed_form", "output_grams"),
    ("calibration",),
    ("factorise", "sequential"),
    ("quantized_factors", "sensitivity"),
    ("correction_ranks",),
    ("quantized_dense",),
    ("heal.distill",),
    (
        "steps",
        "steps.allocation",
        "steps.calibration",
        "steps.context",
        "steps.factorisation",
        "steps.healing",
        "steps.quantization",
        "steps.sizes",
    ),
    ("journal",),
    ("footprint", "pipeline"),
    ("workspace",),
)


def test_inside_compression_every_import_goes_down_a_layer_or_stays_in_its_subpackage():
    prefix = "svdmlp.compression."
    layer_of = {prefix + name: index for index, names in enumerate(COMPRESSION_LAYERS) for name in names}
    inside = {module for module in MODULES if module.startswith(prefix)}
    assert inside == set(layer_of), "every module of svdmlp.compression has its place in COMPRESSION_LAYERS"
    assert _imports("svdmlp.compression") == set()  # the package itself imports nothing
    wrong = []
    for module in sorted(inside):
        for target in sorted(_imports(module) & inside):
            parent = module.rsplit(".", 1)[0]
            own = parent != "svdmlp.compression" and (target == parent or target.startswith(parent + "."))
            if layer_of[target] >= layer_of[module] and not own:
                wrong.append(f"{module} imports {target}")
    assert wrong == []


def test_no_import_cycle():
    graph = {module: _imports(module) for module in MODULES}
    done, path = set(), []

    def visit(module: str) -> None:
        assert module not in path, " -> ".join([*path[path.index(module) :], module])
        if module in done:
            return
        path.append(module)
        for target in sorted(graph[module]):
            # A package's __init__ importing its own submodules is the package, not a cycle.
            if not target.startswith(module + "."):
                visit(target)
        path.pop()
        done.add(module)

    for module in sorted(graph):
        visit(module)


def test_tests_mirror_the_package():
    """tests/A/B/test_NAME[_ASPECT].py tests the module svdmlp/A/B/NAME.py, or the package A/B itself
    when NAME is its name (tests/test_svdmlp.py: the whole package)."""
    orphans = []
    for path in TESTS.rglob("test_*.py"):
        folder = path.parent.relative_to(TESTS).parts
        words = path.stem.removeprefix("test_").split("_")
        names = {"_".join(words[:n]) for n in range(1, len(words) + 1)}
        package = ".".join(("svdmlp", *folder))
        candidates = {f"{package}.{name}" for name in names} | {
            package for name in names if name == (folder[-1] if folder else "svdmlp")
        }
        if not candidates & set(MODULES):
            orphans.append(str(path.relative_to(TESTS)))
    assert orphans == []


def test_the_public_api_resolves_with_every_module_imported():
    """``svdmlp.compress`` stays the function even once every submodule has been imported (a
    subpackage of that name would shadow it)."""
    # The vLLM plugin imports vLLM, which lives in its own environment (make serve-env).
    skipped = {"svdmlp.__main__"} | (
        set() if importlib.util.find_spec("vllm") else {"svdmlp.serving.vllm_plugin"}
    )
    for module in sorted(MODULES):
        if module not in skipped:
            importlib.import_module(module)
    for name in svdmlp.__all__:
        assert getattr(svdmlp, name) is not None, name
    assert callable(svdmlp.compress) and callable(svdmlp.load) and callable(svdmlp.set_backend)
