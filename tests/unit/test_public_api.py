"""The public surface: one curated, sorted ``__all__``, every public name documented."""

from __future__ import annotations

import inspect
import tomllib
from importlib.metadata import version

import sa_jobqueue
from sa_jobqueue import errors
from tests.helpers.processes import REPO_ROOT

#: Dunder names that are part of the API too (as httpx exports its ``__version__``).
PUBLIC_DUNDERS = {"__version__"}


def test_all_is_sorted_and_complete() -> None:
    assert sa_jobqueue.__all__ == sorted(sa_jobqueue.__all__)
    public = {
        name for name in vars(sa_jobqueue) if not name.startswith("_") or name in PUBLIC_DUNDERS
    }
    modules = {name for name in public if inspect.ismodule(getattr(sa_jobqueue, name))}
    assert public - modules == set(sa_jobqueue.__all__)


def test_version_is_the_distributions() -> None:
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    assert sa_jobqueue.__version__ == version("sa_jobqueue") == pyproject["project"]["version"]


def test_every_exported_name_has_a_docstring() -> None:
    for name in sorted(set(sa_jobqueue.__all__) - PUBLIC_DUNDERS):
        obj = getattr(sa_jobqueue, name)
        assert inspect.getdoc(obj), f"{name} has no docstring"
        for attr, member in vars(obj).items():
            if attr.startswith("_") or not callable(member):
                continue
            assert inspect.getdoc(member), f"{name}.{attr} has no docstring"


#: Exceptions a handler raises to steer its job: signals, not errors of ours.
CONTROL_FLOW = (sa_jobqueue.Retry, sa_jobqueue.Discard)


def test_every_error_derives_from_the_root_and_has_a_default_message() -> None:
    for name in sa_jobqueue.__all__:
        obj = getattr(sa_jobqueue, name)
        if isinstance(obj, type) and issubclass(obj, BaseException) and obj not in CONTROL_FLOW:
            assert issubclass(obj, errors.JobQueueError)
            assert str(obj()) == inspect.getdoc(obj).splitlines()[0]  # type: ignore[union-attr]


def test_the_queue_modules_own_names_are_on_its_reference_page() -> None:
    # The enqueue option types are public in sa_jobqueue.queue only, not in sa_jobqueue's
    # curated __all__ (enqueueing needs no name of theirs; a wrapper that passes options on
    # annotates with them): the module's page documents each one.
    import sa_jobqueue.queue

    page = (REPO_ROOT / "docs" / "reference" / "api" / "queue.md").read_text().splitlines()
    shown = {line.removeprefix("::: ").strip() for line in page if line.startswith("::: ")}
    own = set(sa_jobqueue.queue.__all__) - set(sa_jobqueue.__all__)
    assert own == {"JobOptions", "EnqueueOptions", "EnqueueManyOptions"}
    assert {f"sa_jobqueue.queue.{name}" for name in own} <= shown
