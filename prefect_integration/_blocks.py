"""The integration's Prefect block: where an OpenJD flow keeps its checkpoints.

Registered with Prefect through the ``prefect.collections`` entry point (importing this package
defines the block class; a Prefect server started where the package is installed registers it,
so the UI can create one).
"""

from __future__ import annotations

from typing import Any, Literal

from prefect.blocks.core import Block
from prefect.filesystems import LocalFileSystem, RemoteFileSystem
from pydantic import Field, field_validator

__all__ = ("CheckpointStoreBlock",)


class CheckpointStoreBlock(Block):
    """Where OpenJD flows keep checkpoints and task records: a directory or an fsspec URL
    (``s3://bucket/prefix``), or the base path of a Prefect ``LocalFileSystem`` /
    ``RemoteFileSystem`` block. Every machine that runs the flows must reach it.

    Use: ``flow_from_template("render.yaml", store=CheckpointStoreBlock.load("prod"))``.

    Attributes:
        location: a directory path or an fsspec URL.
        storage: a Prefect file system block whose ``basepath`` is used instead (its
            ``settings``, such as credentials, are not passed on: configure the file system
            through fsspec's usual configuration).
        files: how the store treats checkpoint files: ``shared`` (paths only, on a file system
            every worker sees) or ``managed`` (the store keeps the files tasks name and restores
            them into the session working directory of the task that resumes, on any
            machine); None: ``$OPENJD_CHECKPOINT_FILES`` where the flow runs, else ``shared``.
        file_roots: absolute folders, besides the session working directory, whose files a
            managed store may capture and restore (``$OPENJD_CHECKPOINT_FILE_ROOTS`` is added).
        interruption_notices: interruption notice sources of the flows' task runs, as the CLI's
            ``--interruption-notices`` takes them (``aws,gcp,azure,file:PATH``); None:
            ``$OPENJD_CHECKPOINT_INTERRUPTION_NOTICES`` where the task runs.
        notice_poll_seconds: at most one request per notice source this often (None:
            ``$OPENJD_CHECKPOINT_NOTICE_POLL_SECONDS``, else 5 s).
    """

    _block_type_name = "OpenJD Checkpoint Store"
    _block_type_slug = "openjd-checkpoint-store"
    _description = "Where OpenJD job template flows keep their checkpoints (openjd-checkpoint)."

    location: str | None = Field(
        default=None, description="A directory path or an fsspec URL (s3://bucket/prefix)."
    )
    storage: LocalFileSystem | RemoteFileSystem | None = Field(
        default=None, description="A file system block whose base path is used instead."
    )
    files: Literal["shared", "managed"] | None = Field(
        default=None,
        description=(
            "Checkpoint files: 'shared' (paths only, on a file system every worker sees) or "
            "'managed' (the store keeps them and restores them on resume, on any machine). "
            "Empty: $OPENJD_CHECKPOINT_FILES where the flow runs, else 'shared'."
        ),
    )
    file_roots: list[str] = Field(
        default_factory=list,
        description=(
            "Absolute folders, besides the session working directory, whose files a managed "
            "store may capture and restore."
        ),
    )

    interruption_notices: str | None = Field(
        default=None,
        description=(
            "Interruption notice sources (aws, gcp, azure, each optionally NAME:BASE_URL; "
            "file:PATH): a notice checkpoints running tasks; the retry resumes them. Empty: "
            "$OPENJD_CHECKPOINT_INTERRUPTION_NOTICES where the task runs."
        ),
    )
    notice_poll_seconds: float | None = Field(
        default=None,
        description="At most one request per notice source this often, in seconds (default 5).",
    )

    @field_validator("interruption_notices")
    @classmethod
    def _notices(cls, value: str | None) -> str | None:
        if value is not None:
            import core

            core.NoticeSettings.given(value, where="interruption_notices")
        return value

    @field_validator("notice_poll_seconds")
    @classmethod
    def _poll(cls, value: float | None) -> float | None:
        if value is not None:
            import core

            core.NoticeSettings.given(poll_seconds=value, poll_where="notice_poll_seconds")
        return value

    @field_validator("file_roots")
    @classmethod
    def _absolute(cls, roots: list[str]) -> list[str]:
        import core

        core.FileSettings.resolve(file_roots=roots)  # ValueError: a root that is not absolute
        return roots

    def store_location(self) -> str:
        """The store's location (a path or an fsspec URL).

        Raises:
            ValueError: neither ``location`` nor a ``storage`` with a base path is set.
        """
        if self.location:
            return self.location
        basepath: Any = getattr(self.storage, "basepath", None)
        if basepath:
            return str(basepath)
        raise ValueError("the checkpoint store block has neither a location nor a storage")
