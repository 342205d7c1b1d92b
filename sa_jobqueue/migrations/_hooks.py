"""The two hooks an application's env.py passes to ``context.configure()`` when our revisions
join its Alembic history. Imported from :mod:`sa_jobqueue.migrations`; this module's path is not
part of the API.

Why they are needed: our revisions sit in a version location of their own (the installed
package's ``migrations/versions``), on a branch of their own. Left alone, Alembic writes a new
revision next to the head it revises; in a history where ours is the only head that is *inside
the installed package* (lost at the next install), and once the application has a head too,
Alembic stops with "Multiple heads". And autogenerate compares every table it finds with the
metadata it is given, so ours would show up in the application's diffs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from alembic.operations.ops import MigrationScript
from alembic.runtime.migration import MigrationContext
from alembic.script import Script, ScriptDirectory
from alembic.util import CommandError, coerce_resource_to_filename
from sqlalchemy.schema import SchemaItem

from ..models import BRANCH_LABEL

#: Every table sa_jobqueue creates, and the version table of its own route, starts with this.
TABLE_PREFIX: Final = "sa_jobqueue_"
#: Our revisions' ids all start with this.
REVISION_PREFIX: Final = "sajq_"
#: The directory our revisions are in, wherever this package is installed.
OUR_VERSIONS: Final = Path(__file__).resolve().parent / "versions"


def include_object(
    object_: SchemaItem,
    name: str | None,
    type_: str,
    reflected: bool,
    compare_to: SchemaItem | None,
) -> bool:
    """Keep sa_jobqueue's tables out of autogenerate: ``context.configure(include_object=...)``.

    Returns False for a table whose name starts with ``sa_jobqueue_`` (our tables, and the
    version table ``sa-jobqueue migrate`` keeps), whether it is in the database or in a metadata
    you pass, so autogenerate neither creates, alters nor drops them: our own revisions do that.
    Returns True for everything else.

    Not guaranteed: a table of yours whose name starts with ``sa_jobqueue_`` is hidden too.
    Alembic passes one ``include_object`` only; if you have one, call this one from it.
    """
    return not (type_ == "table" and name is not None and name.startswith(TABLE_PREFIX))


def process_revision_directives(
    context: MigrationContext, revision: object, directives: list[MigrationScript]
) -> None:
    """Put each new revision on your own branch, in your own versions directory.

    For ``context.configure(process_revision_directives=...)``. A new revision revises your
    head, not ours: your only head when you have one, else it starts your branch on a base of
    its own (``down_revision = None``). It is written to the directory of the head it revises,
    or, for your first one, to the one entry of ``version_locations`` that is not ours. It
    stops the command with one line (Alembic's ``CommandError``) instead of writing into the
    installed package: when ``--head`` or ``--version-path`` name our branch, when
    ``version_locations`` lists no directory of yours, and when your history has several heads
    (merge them, naming them: ``alembic merge heads`` would merge ours too).

    Not guaranteed: it runs only when env.py runs, which ``alembic revision --autogenerate``
    always does and a plain ``alembic revision`` does only with ``revision_environment = true``
    in alembic.ini; ``alembic merge`` never calls it. Revisions are told apart by file location
    (ours are the installed package's ``migrations/versions``) and by the ``sajq_`` id prefix.
    """
    environment = context.environment_context
    if environment is None:  # not run by an Alembic command: nothing is being generated
        return
    for directive in directives:
        _place(directive, environment.script)


def _place(directive: MigrationScript, script: ScriptDirectory) -> None:
    locations = _version_locations(script)
    yours = [location for location in locations if not _is_our_directory(location)]
    if not yours:
        raise CommandError(
            "version_locations lists only sa_jobqueue's revisions: add a directory of your own"
            " in front of sa_jobqueue:migrations/versions (see the Alembic guide in"
            " sa_jobqueue's docs)"
        )
    if directive.version_path is not None and _is_our_directory(Path(directive.version_path)):
        raise CommandError(
            f"{directive.version_path} holds sa_jobqueue's revisions, installed with the"
            " package: write yours to a directory of your own"
        )
    if directive.head in (None, "head"):
        heads = [rev for rev in script.get_revisions("heads") if isinstance(rev, Script)]
        your_heads = sorted(rev.revision for rev in heads if not _is_ours(rev))
        if len(your_heads) > 1:
            raise CommandError(
                f"your history has several heads ({', '.join(your_heads)}): merge them with"
                f" `alembic merge {' '.join(your_heads)}`, or pick one with --head"
            )
        directive.head = your_heads[0] if your_heads else "base"
    else:
        try:
            named = script.get_revisions(directive.head)
        except Exception as exc:  # Alembic's own message, e.g. an unknown revision
            raise CommandError(str(exc)) from exc
        ours = sorted(rev.revision for rev in named if isinstance(rev, Script) and _is_ours(rev))
        if ours:
            raise CommandError(
                f"--head {directive.head} names sa_jobqueue's revision {', '.join(ours)} (branch"
                f" {BRANCH_LABEL}): base yours on your own head; to run after our tables"
                f" exist, add --depends-on {BRANCH_LABEL}@head"
            )
    if directive.version_path is None and directive.head == "base":
        if len(yours) > 1:
            raise CommandError(
                "version_locations lists several directories of yours: pick one for your"
                " first revision with --version-path"
            )
        directive.version_path = str(yours[0])


def _version_locations(script: ScriptDirectory) -> list[Path]:
    """The script directory's version locations as Alembic resolves them (absolute)."""
    configured = script.version_locations or [str(Path(script.dir) / "versions")]
    return [Path(str(coerce_resource_to_filename(str(loc)))).absolute() for loc in configured]


def _is_our_directory(path: Path) -> bool:
    return path.resolve() == OUR_VERSIONS


def _is_ours(revision: Script) -> bool:
    return revision.revision.startswith(REVISION_PREFIX) or _is_our_directory(
        Path(revision.path).parent
    )
