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


def test_every_error_class_is_in_errors_py() -> None:
    """A JobstoreError defined anywhere but jobstore/errors.py would be one a caller cannot find
    where the others are."""
    import ast
    import inspect
    from pathlib import Path

    from jobstore import errors

    ours = {name for name, obj in vars(errors).items()
            if inspect.isclass(obj) and issubclass(obj, errors.JobstoreError)}
    assert len(ours) > 20
    root = Path(jobstore.__file__).parent
    elsewhere = []
    for path in root.rglob("*.py"):
        if path == root / "errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = {b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "")
                         for b in node.bases}
                if bases & ours:
                    elsewhere.append(f"{path.relative_to(root)}: {node.name}")
    assert not elsewhere, elsewhere
