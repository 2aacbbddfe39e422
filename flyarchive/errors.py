"""Errors raised by flyarchive.

Every error is also a builtin (``ValueError``, ``FileNotFoundError``...), so code
that catches builtins keeps working. Messages say what was asked, what exists,
and how to fix it.
"""

from __future__ import annotations

__all__ = [
    "FlyarchiveError",
    "ArchiveExistsError",
    "ArchiveNotFoundError",
    "SchemaError",
    "SchemaVersionError",
    "LayoutMismatchError",
    "NonFiniteStateError",
    "StorageBackendMissingError",
    "StorageError",
    "WorldBlockConflictError",
    "ArchiveInUseError",
    "NpzFormatError",
    "ModelLoadError",
    "CameraNotFoundError",
    "SelectionError",
    "FrameSizeError",
    "OutputExistsError",
    "RenderBackendError",
    "MissingDependencyError",
    "CorruptArchiveError",
    "RecordingError",
    "ImportMismatchError",
    "OutputLocationError",
    "RenderFailedError",
    "RenderOptionsError",
    "TimingError",
    "CodecSpecError",
    "UnsafeFileError",
    "FrameFormatError",
    "VideoEncodeError",
]


class FlyarchiveError(Exception):
    """Base class of every flyarchive error."""


class ArchiveExistsError(FlyarchiveError, FileExistsError):
    """An archive (or something else) is already at the URL and the mode forbids overwriting."""


class ArchiveNotFoundError(FlyarchiveError, FileNotFoundError):
    """Nothing that looks like an archive is at the URL."""


class SchemaError(FlyarchiveError, ValueError):
    """The dataset does not follow the flyarchive schema."""


class SchemaVersionError(SchemaError):
    """The archive was written with a schema version this flyarchive cannot read."""


class LayoutMismatchError(FlyarchiveError, ValueError):
    """A model's qpos/mocap layout differs from the archive's."""


class NonFiniteStateError(FlyarchiveError, ValueError):
    """The simulation state holds NaN or infinity."""


class StorageBackendMissingError(FlyarchiveError, ImportError):
    """The fsspec protocol of a URL needs a package that is not installed."""


class StorageError(FlyarchiveError, OSError):
    """Reading or writing the storage failed."""


class WorldBlockConflictError(FlyarchiveError, RuntimeError):
    """Another writer already owns some of the worlds asked for."""


class ArchiveInUseError(WorldBlockConflictError):
    """Another writer holds the archive (a writer claim of the whole archive or of a block)."""


class NpzFormatError(FlyarchiveError, ValueError):
    """A flygym RecordedTrajectory ``.npz`` file is malformed."""


class ModelLoadError(FlyarchiveError, ValueError):
    """A MuJoCo model file could not be loaded."""


class CameraNotFoundError(FlyarchiveError, KeyError):
    """A camera name is not in the model."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


class SelectionError(FlyarchiveError, ValueError):
    """A selection of worlds or times is empty or outside the archive."""


class FrameSizeError(FlyarchiveError, ValueError):
    """A frame size the renderer or the video encoder cannot take."""


class OutputExistsError(FlyarchiveError, FileExistsError):
    """An output file exists and overwriting was not asked for."""


class RenderBackendError(FlyarchiveError, RuntimeError):
    """The rendering backend (EGL, Warp) cannot be used here."""


class MissingDependencyError(FlyarchiveError, ImportError):
    """An optional dependency is missing; the message names the extra to install."""


class CorruptArchiveError(FlyarchiveError, ValueError):
    """Stored bytes fail their checksum or committed frames are missing."""


class RecordingError(FlyarchiveError, ValueError):
    """A recorder was given states that do not fit its recording: another number of
    worlds, worlds at different times, or a simulation that went back in time."""


class RenderFailedError(FlyarchiveError, RuntimeError):
    """A render task failed on a worker (it died, or raised an unexpected error)."""


class FrameFormatError(FlyarchiveError, TypeError):
    """Frames are not uint8 arrays."""


class VideoEncodeError(FlyarchiveError, RuntimeError):
    """ffmpeg failed, or a video would be empty or mixes incompatible segments."""


class TimingError(FlyarchiveError, ValueError):
    """Frame timing that cannot work with the simulation's timestep."""


class CodecSpecError(FlyarchiveError, ValueError):
    """A codec specification that flyarchive does not know."""


class UnsafeFileError(CorruptArchiveError):
    """A file of a local archive that flyarchive refuses to open or write through: not a
    regular file, leading out of the archive, or larger than its array can need. The
    message names the file and points at ``flyarchive verify``."""


class RenderOptionsError(FlyarchiveError, ValueError):
    """Render options that cannot be used (an unknown backend, a segment of no frames...)."""


def missing_dependency(package: str, extra: str, what: str) -> MissingDependencyError:
    """Build the error for a missing optional dependency.

    Args:
        package: The import name that failed, e.g. ``"s3fs"``.
        extra: The flyarchive extra that installs it, e.g. ``"s3"``.
        what: What the user asked for that needs it.
    """
    return MissingDependencyError(
        f"{what} needs the package {package!r}, which is not installed. "
        f"Install it with: pip install 'flyarchive[{extra}]'"
    )


# ----------------------------------------------------------------------------- interop
class ImportMismatchError(FlyarchiveError, ValueError):
    """An interrupted ``.npz`` import cannot be resumed with these files or this model."""


class OutputLocationError(FlyarchiveError, NotADirectoryError):
    """An output location that must be a folder is a file (or another non-folder)."""
