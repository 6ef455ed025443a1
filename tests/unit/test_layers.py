"""The package's shape as a caller meets it: the public face, and a hot path that stays light."""

from __future__ import annotations

import subprocess
import sys

import jobstore

# Not on the hooks' hot path: the libraries of the layers above, and `typing` (about 12 ms, more
# than the rest of a hook's start).
HEAVY = ("sqlalchemy", "psycopg", "classad2", "htcondor2", "click", "alembic", "jobstore.db",
         "typing")


def test_the_public_face_names_what_it_exports() -> None:
    from jobstore.core.jobs import JobSpec
    from jobstore.db.store import JobStore

    assert jobstore.JobStore is JobStore and jobstore.JobSpec is JobSpec
    assert set(jobstore.__all__) <= set(dir(jobstore))
    for name in jobstore.__all__:
        assert getattr(jobstore, name) is not None


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        jobstore.NoSuchThing  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:
        raise AssertionError("jobstore.NoSuchThing did not raise")


def test_the_hooks_hot_path_imports_nothing_heavy() -> None:
    """What an installed hook imports before it talks to the agent: the standard library and
    the stdlib-only modules (import-linter checks the direct imports; this, the whole closure)."""
    code = (
        "import sys; import jobstore.agent.client; "
        f"print(sorted(m for m in sys.modules if m.startswith({HEAVY!r})))"
    )
    out = subprocess.run([sys.executable, "-sS", "-c", code], capture_output=True, text=True,
                         check=True, env={"PYTHONPATH": str(jobstore.__path__[0] + "/..")})
    assert out.stdout.strip() == "[]", out.stdout


def test_a_direct_mode_hook_imports_no_submit_side() -> None:
    """A hook without an agent imports the handlers and the store, not what reads submit
    descriptions and DAG files (nor htcondor2): a third of its CPU is its imports."""
    code = ("import sys; import jobstore.node.hookmain, jobstore.node.handlers, "
            "jobstore.db.store; "
            "print(sorted(m for m in sys.modules if m.startswith(('jobstore.submit', "
            "'htcondor2', 'alembic'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_every_error_class_is_in_errors_py() -> None:
    """Every error class is rooted under JobstoreError (no other class of the package derives
    from Exception itself), and a public one is in jobstore/errors.py, where a caller finds the
    others; a module keeps its private ones (named _...)."""
    import ast
    import inspect
    from pathlib import Path

    from jobstore import errors

    ours = {name for name, obj in vars(errors).items()
            if inspect.isclass(obj) and issubclass(obj, errors.JobstoreError)}
    assert len(ours) > 20
    root = Path(jobstore.__file__).parent
    elsewhere, unrooted = [], []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = {b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "")
                         for b in node.bases}
                where = f"{path.relative_to(root)}: {node.name}"
                if bases & {"Exception", "BaseException"} and node.name != "JobstoreError":
                    unrooted.append(where)
                if (path != root / "errors.py" and bases & ours
                        and not node.name.startswith("_")):
                    elsewhere.append(where)
    assert not unrooted, unrooted
    assert not elsewhere, elsewhere


def test_the_architecture_page_is_the_layers_contract_and_names_every_module() -> None:
    """docs/architecture.md: its diagram's layers, top to bottom, are pyproject.toml's layers
    contract, and each package's paragraph names each of its modules."""
    import re
    import tomllib
    from pathlib import Path

    root = Path(jobstore.__file__).parent.parent
    page = (root / "docs" / "architecture.md").read_text()
    contracts = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["importlinter"]
    (layers,) = [c["layers"] for c in contracts["contracts"] if c["type"] == "layers"]
    diagram = page.split("```mermaid", 1)[1].split("```", 1)[0]
    drawn: list[str] = []
    for name in re.findall(r'\w+\["(jobstore\.\w+)"\]', diagram):
        if name not in drawn:
            drawn.append(name)
    flat = [name.strip() for layer in layers for name in layer.split("|")]
    assert drawn == flat, (drawn, flat)
    paragraphs = dict(re.findall(r"\*\*`(jobstore\.\w+)`\*\*(.*?)(?=\n\n|\Z)", page, re.S))
    assert set(paragraphs) == set(flat)
    for package, text in paragraphs.items():
        directory = root / package.replace(".", "/")
        if not directory.is_dir():
            continue
        modules = {p.stem for p in directory.glob("*.py")} | {
            p.name for p in directory.iterdir() if (p / "__init__.py").exists()}
        named = set(re.findall(r"`(\w+)`", text))
        missing = {m for m in modules if not m.startswith("_")} - named
        assert not missing, f"{package}: {sorted(missing)} not in docs/architecture.md"
