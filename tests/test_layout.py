"""The package's two layers: the library never imports the book's instruments."""

import ast
import pathlib

import pargrad

PACKAGE = pathlib.Path(pargrad.__file__).parent
LIBRARY = sorted(path for path in PACKAGE.glob("*.py"))


def imported_modules(path):
    """Every module a file imports, at any depth (also inside functions)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
            names += [f"{node.module}.{alias.name}" for alias in node.names]
    return names


def test_the_library_never_imports_the_book():
    assert len(LIBRARY) >= 8, "the library modules moved; update this test"
    offenders = {path.name: [name for name in imported_modules(path)
                             if name == "pargrad.book" or name.startswith("pargrad.book.")]
                 for path in LIBRARY if path.name != "__init__.py"}
    offenders = {name: found for name, found in offenders.items() if found}
    assert not offenders, (f"library modules import the book layer: {offenders}; move the "
                           "code they need into the library, or the module into pargrad/book")


def test_the_book_layer_is_a_sub_package_with_its_data():
    assert (PACKAGE / "book" / "__init__.py").exists()
    assert sorted(p.name for p in (PACKAGE / "book" / "data").glob("*.json")) == [
        "rare_communication_sweeps.json", "sync_vs_async.json", "sync_vs_async_virtual.json"]
    assert pargrad.race.stored_sweep("sync_vs_async_virtual")


def test_the_names_chapters_use_still_resolve():
    for name in ("parabola_model", "parabola_data", "train_parabola", "show_source", "show_lines",
                 "digits", "race", "InstrumentedSyncTrainer", "backup_worker_mask",
                 "sync_step_times", "SyncTrainer", "AsyncTrainer"):
        assert hasattr(pargrad, name), name


def test_importing_pargrad_loads_no_book_module():
    """A cluster worker imports pargrad, not the book (its figures, tasks, stored sweeps).

    Not asserted: matplotlib and IPython themselves, because Keras 3 imports both
    on ``import keras`` (keras/src/visualization, keras/src/saving/file_editor.py).
    """
    import subprocess
    import sys

    code = ("import sys, pargrad; "
            "book = sorted(m for m in sys.modules if m.startswith('pargrad.book')); "
            "assert not book, book; "
            "assert pargrad.race.__name__ == 'pargrad.book.race'; "
            "assert 'pargrad.book' in sys.modules")
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               timeout=120, check=False)
    assert completed.returncode == 0, completed.stderr[-2000:]
