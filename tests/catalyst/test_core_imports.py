"""The core imports nothing of Catalyst: every module of torchstage but the compat layer (torchstage/catalyst/) and
the edge (torchstage/__init__.py) is parsed, imports inside functions included."""
import ast
import os

import torchstage

PACKAGE = os.path.dirname(os.path.abspath(torchstage.__file__))
COMPAT = "torchstage.catalyst"


def core_modules() -> dict:
    """Dotted name -> path of every core module."""
    found = {}
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            path = os.path.join(folder, name)
            dotted = "torchstage." + os.path.relpath(path, PACKAGE)[:-3].replace(os.sep, ".")
            if not name.endswith(".py") or dotted == "torchstage.__init__" or \
                    dotted == COMPAT or dotted.startswith(COMPAT + "."):
                continue
            found[dotted.removesuffix(".__init__")] = path
    return found


def imported_names(path: str, module: str) -> set:
    """Every module that ``path`` imports, anywhere in it (relative imports resolved against ``module``)."""
    names = set()
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".")
                is_package = path.endswith("__init__.py")
                base = ".".join(parts[:len(parts) - node.level + is_package] + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) in (
                "import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant):
            names.add(str(node.args[0].value))
    return names


def test_the_scan_sees_the_core():
    modules = core_modules()
    assert {"torchstage.runner.runner", "torchstage.callbacks.base", "torchstage.metrics",
            "torchstage.config.train_call"} <= set(modules)
    assert not any(name.startswith(COMPAT) for name in modules)


def test_no_core_module_imports_the_catalyst_layer():
    offenders = {module: sorted(name for name in imported_names(path, module)
                                if name == COMPAT or name.startswith(COMPAT + "."))
                 for module, path in core_modules().items()}
    offenders = {module: names for module, names in offenders.items() if names}
    assert not offenders, f"core modules importing {COMPAT}: {offenders}"


def test_the_scan_catches_an_import_inside_a_function(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("def f():\n    from torchstage.catalyst.runner import translate_train_kwargs\n")
    assert "torchstage.catalyst.runner" in imported_names(str(path), "torchstage.runner.m")
    path.write_text("from ..catalyst import names\n")
    assert "torchstage.catalyst.names" in imported_names(str(path), "torchstage.runner.m")
