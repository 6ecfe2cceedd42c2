"""The trainer contract: a subclass of a pargrad trainer uses only the private names its
parent lists in ``pargrad.sync.SUBCLASS_CONTRACT`` (read with ``ast``, nothing imported).

A private name of the parent is a method or a ``self._x`` attribute that the parent's
class body defines; a subclass *uses* it when it overrides it, reads it or assigns it
(``self._x``, ``super()._x``).  Public names (``fit``, ``variables_by_component``) are free.
"""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "pargrad"


def _classes(sources):
    """``{class name: (ast.ClassDef, file)}`` of every class in ``sources`` ({file: text})."""
    found = {}
    for path, text in sources.items():
        for node in ast.walk(ast.parse(text, filename=str(path))):
            if isinstance(node, ast.ClassDef):
                found[node.name] = (node, path)
    return found


def _base_names(node):
    return [b.id if isinstance(b, ast.Name) else b.attr for b in node.bases
            if isinstance(b, (ast.Name, ast.Attribute))]


def _private(name):
    return name.startswith("_") and not name.startswith("__")


def defined_names(node):
    """The private methods of a class body and the private ``self._x`` it assigns."""
    names = {item.name for item in node.body
             if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(item.name)}
    for sub in ast.walk(node):
        targets = (sub.targets if isinstance(sub, ast.Assign)
                   else [sub.target] if isinstance(sub, (ast.AugAssign, ast.AnnAssign)) else [])
        for target in targets:
            if (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                    and target.value.id == "self" and _private(target.attr)):
                names.add(target.attr)
    return names


def used_names(node):
    """Private names a class body defines as methods or reaches on ``self`` / ``super()``."""
    names = {item.name for item in node.body
             if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(item.name)}
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and _private(sub.attr):
            value = sub.value
            if isinstance(value, ast.Name) and value.id == "self":
                names.add(sub.attr)
            elif (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
                  and value.func.id == "super"):
                names.add(sub.attr)
    return names


def contract(sync_source):
    """The names listed in ``SUBCLASS_CONTRACT`` of ``pargrad/sync.py`` (its source)."""
    for node in ast.parse(sync_source).body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and getattr(node.targets[0], "id", None) == "SUBCLASS_CONTRACT"):
            listed = ast.literal_eval(node.value)
            return {name for names in listed.values() for name in names}
    raise AssertionError("pargrad/sync.py declares no SUBCLASS_CONTRACT")


def violations(sources, allowed, root="SyncTrainer"):
    """``{subclass: sorted private names of its ancestors used outside ``allowed``}``."""
    classes = _classes(sources)
    trainers = {root}
    changed = True
    while changed:       # every class that descends from the root, in the given sources
        changed = False
        for name, (node, _) in classes.items():
            if name not in trainers and trainers & set(_base_names(node)):
                trainers.add(name)
                changed = True
    found = {}
    for name in sorted(trainers - {root}):
        node, _ = classes[name]
        inherited, queue = set(), [b for b in _base_names(node) if b in trainers]
        while queue:
            parent = queue.pop()
            inherited |= defined_names(classes[parent][0])
            queue += [b for b in _base_names(classes[parent][0]) if b in trainers]
        outside = sorted((used_names(node) & inherited) - allowed)
        if outside:
            found[name] = outside
    return found


def package_sources():
    return {path: path.read_text() for path in sorted(PACKAGE.rglob("*.py"))}


def test_subclasses_of_a_pargrad_trainer_use_only_the_contract():
    sources = package_sources()
    allowed = contract((PACKAGE / "sync.py").read_text())
    found = violations(sources, allowed)
    assert sum(len(names) for names in found.values()) == 0, (
        f"private names of a parent trainer used outside pargrad.sync.SUBCLASS_CONTRACT: "
        f"{found}; use a name of the contract, or add a documented one to it")


def test_the_known_subclasses_are_checked():
    names = set(_classes(package_sources()))
    assert {"ShardedTrainer", "InstrumentedSyncTrainer"} <= names


def test_every_contract_name_exists_in_the_parent():
    sync = (PACKAGE / "sync.py").read_text()
    parent = _classes({"sync.py": sync})["SyncTrainer"][0]
    assert contract(sync) <= defined_names(parent)


def test_the_check_catches_patched_state_and_undeclared_overrides():
    sources = {"a.py": (
        "class SyncTrainer:\n"
        "    def _hidden(self):\n        self._state = 1\n"
        "    def _history(self):\n        pass\n"
        "class Child(SyncTrainer):\n"
        "    def _hidden(self):\n        self._state = 2\n        self._own = 3\n"
        "    def _history(self):\n        return super()._history()\n")}
    assert violations(sources, {"_history"}) == {"Child": ["_hidden", "_state"]}
