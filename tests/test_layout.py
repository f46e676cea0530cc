"""The package's architecture, checked from its source: import layers without circles, the proposer / decoder seam
the oracle drafts through, files short enough to read, and no aliases left from the old layout."""

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# the source folders and the package names they install as (pyproject.toml's package-dir)
SOURCES = {"hf_dflash": ROOT / "hf_dflash", "hf_dflash.modeling": ROOT / "modeling"}
LOWER = ("hf_dflash.modeling", "hf_dflash.prompts", "hf_dflash.paths", "hf_dflash.devices", "hf_dflash.cpu_ops",
         "hf_dflash.sampling", "hf_dflash.bigram")
HIGHER = ("hf_dflash.generation", "hf_dflash.training", "hf_dflash.bench", "hf_dflash.cli")


def _modules() -> dict[str, Path]:
    modules = {}
    for package, folder in SOURCES.items():
        for path in folder.rglob("*.py"):
            if "drafters" in path.parts:
                continue
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join([package, *parts])] = path
    return modules


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The package's own modules `name` imports, at module level or inside functions."""
    is_package = path.name == "__init__.py"
    base = name.split(".") if is_package else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            origin = ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else [])) \
                if node.level else node.module
            targets = [f"{origin}.{alias.name}" if f"{origin}.{alias.name}" in MODULES else origin
                       for alias in node.names]
        else:
            continue
        found.update(t for t in targets if t in MODULES and t != name)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _within(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_the_source_was_found():
    assert {"hf_dflash.generation.loop", "hf_dflash.generation.proposer", "hf_dflash.bench.oracle",
            "hf_dflash.modeling.modeling_dflash", "hf_dflash.prompts"} <= set(MODULES)
    assert "hf_dflash.generation.decoder" in GRAPH["hf_dflash.generation.loop"]


def test_no_import_circles():
    def parent_packages(name):  # importing a module runs its parents first: not an edge of a circle
        parts = name.split(".")
        return {".".join(parts[:i]) for i in range(1, len(parts))}

    state = {}

    def visit(name, stack):
        state[name] = "open"
        for other in sorted(GRAPH[name] - parent_packages(name)):
            if state.get(other) == "open":
                cycle = stack[stack.index(other):] + [other]
                pytest.fail("import circle: " + " -> ".join(cycle))
            if other not in state:
                visit(other, stack + [other])
        state[name] = "done"

    for name in sorted(GRAPH):
        if name not in state:
            visit(name, [name])


def test_lower_layers_import_nothing_from_higher_ones():
    for name, imported in GRAPH.items():
        if _within(name, LOWER):
            bad = sorted(i for i in imported if _within(i, HIGHER))
            assert not bad, f"{name} imports {bad}"


def test_the_modeling_code_stands_alone():
    """modeling/ is also the Hub's remote code: it imports nothing from the rest of hf_dflash (the model card writer
    that `save_pretrained` calls is set from above, by hf_dflash.hub)."""
    for name, imported in GRAPH.items():
        if _within(name, ["hf_dflash.modeling"]):
            assert all(_within(i, ["hf_dflash.modeling"]) for i in imported), (name, imported)


def test_wings_import_downwards_only():
    # each may use those before it
    order = ["hf_dflash.generation", "hf_dflash.training", "hf_dflash.bench", "hf_dflash.cli"]
    for name, imported in GRAPH.items():
        for rank, wing in enumerate(order):
            if _within(name, [wing]):
                bad = sorted(i for i in imported if _within(i, order[rank + 1:]))
                assert not bad, f"{name} imports {bad}"
    assert "hf_dflash.generation.hooks" not in GRAPH["hf_dflash.generation.loop"]  # the hooks import the loop


def test_the_oracle_drafts_through_public_methods_only():
    from hf_dflash.bench import oracle
    from hf_dflash.generation import Decoder, DFlashProposer
    from hf_dflash.generation.fixed_shape import FixedShapeDecoder

    def owner(cls, name):
        return next(k for k in cls.__mro__ if name in vars(k))

    for cls, base in ((oracle.OracleProposer, DFlashProposer), (oracle.OracleDecoder, Decoder),
                      (oracle.FixedShapeOracleDecoder, FixedShapeDecoder)):
        assert issubclass(cls, base)
        overridden = [n for n in dir(base) if n != "__init__" and callable(getattr(base, n))
                      and owner(cls, n) not in base.__mro__]
        assert overridden and not [n for n in overridden if n.startswith("_")], (cls.__name__, overridden)


@pytest.mark.parametrize("name", sorted(n for n, p in MODULES.items() if n.startswith("hf_dflash")))
def test_no_module_is_too_long_to_read(name):
    assert len(MODULES[name].read_text().splitlines()) <= 500


def test_no_compatibility_shims():
    """The 0.1.0 "Moved" aliases are gone (each concept has one import path)."""
    for gone in ("hf_dflash.hooks", "hf_dflash.tree", "hf_dflash.cost_model", "hf_dflash.data", "hf_dflash.oracle"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(gone)


def test_results_md_is_what_its_snapshots_give():
    """docs/results.md is generated from docs/results/ (examples/results_md.py): never edited by hand, never stale."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, str(ROOT / "examples" / "results_md.py"), "--check"], capture_output=True,
                         text=True, cwd=ROOT)
    assert run.returncode == 0, run.stdout + run.stderr


def test_both_paths_implement_one_interface():
    """The general loop and the fixed-shape path meet the loop at the same methods, with the same signatures: one
    `speculative_loop`, one `DFlashProposer` (only where it keeps its context differs), two decoders."""
    import inspect

    from hf_dflash.generation import Decoder, loop
    from hf_dflash.generation.fixed_shape import FixedShapeDecoder, RowDrafterCache
    from hf_dflash.generation.proposer import DynamicDrafterCache

    decoder_side = ("prefill", "prompt_context", "room", "verify_forward", "accept", "drop_finished", "done",
                    "result", "newest_tokens")
    for name in decoder_side:
        assert inspect.signature(getattr(Decoder, name)) == inspect.signature(getattr(FixedShapeDecoder, name)), name
    for name in ("extend", "select_rows", "forward"):
        assert inspect.signature(getattr(DynamicDrafterCache, name)).parameters.keys() == \
            inspect.signature(getattr(RowDrafterCache, name)).parameters.keys(), name
    assert not hasattr(loop, "fixed_shape_loop") and "sides" not in inspect.signature(loop.dflash_decode).parameters
    source = inspect.getsource(loop.speculative_loop)
    assert all(f"decoder.{name}" in source for name in ("prefill", "prompt_context", "room", "verify_forward",
                                                         "accept", "done"))
