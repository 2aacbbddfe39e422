"""Every exception class flyarchive raises, and the one install hint for missing packages.

Every error is also a builtin (``ValueError``, ``FileNotFoundError``...), so code
that catches builtins keeps working. Messages say what was asked, what exists,
and how to fix it. A missing optional package is always reported by
:func:`missing_dependency` (or :func:`missing_storage_backend` for a URL's protocol),
which names the extra to install; an unknown name gets the closest existing ones from
:func:`did_you_mean`.
"""

from __future__ import annotations

from collections.abc import Iterable

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
    "ArchiveReplacedError",
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
    "UnsafeModelError",
    "ManifestError",
    "FrameFormatError",
    "VideoEncodeError",
    "OptionsError",
    "ConfigError",
    "RequestTooLargeError",
    "RequestTimeoutError",
    "ServerBusyError",
    "UntrustedCacheWarning",
    "did_you_mean",
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


class StorageError(FlyarchiveError, OSError):
    """Reading or writing the storage failed."""


class ArchiveReplacedError(StorageError):
    """The archive an opened dataset reads was replaced (``mode="w"``) or deleted after it
    was opened: open it again."""


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


class RequestTooLargeError(SelectionError):
    """A request to ``flyarchive view`` whose cost (worlds x series x frames, bytes read or
    sent, pixels rendered) passes the viewer's bound (HTTP 413); the message gives the
    bound and how to narrow the request."""


class RequestTimeoutError(FlyarchiveError, TimeoutError):
    """A request's body did not reach ``flyarchive view`` in time (HTTP 408)."""


class ServerBusyError(FlyarchiveError, RuntimeError):
    """``flyarchive view`` already holds as many of these requests (renders) as it keeps
    waiting (HTTP 429).

    Attributes:
        retry_after_s: About how long to wait before asking again, seconds.
    """

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class FrameSizeError(FlyarchiveError, ValueError):
    """A frame size the renderer or the video encoder cannot take."""


class OutputExistsError(FlyarchiveError, FileExistsError):
    """An output file exists and overwriting was not asked for."""


class RenderBackendError(FlyarchiveError, RuntimeError):
    """The rendering backend (EGL, Warp) cannot be used here."""


class MissingDependencyError(FlyarchiveError, ImportError):
    """An optional dependency is missing; the message names the extra to install."""


class StorageBackendMissingError(MissingDependencyError):
    """The fsspec protocol of a URL needs a package that is not installed."""


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
    """A file of a local archive or output folder that flyarchive refuses to open or write
    through: not a regular file, leading out of the archive (or output folder), or larger
    than it can need. The message names the file and what to do (for an archive:
    ``flyarchive verify``)."""


class ManifestError(FlyarchiveError, ValueError):
    """A ``manifest.json`` beside rendered videos that flyarchive cannot read or trust: not
    JSON, nested too deep, or entries of the wrong types. The message names the file, the
    entry and the field."""


class UnsafeModelError(CorruptArchiveError, ModelLoadError):
    """A compiled model read from an archive that MuJoCo cannot load safely: loading it in a
    child process crashed it (a signal), raised ``mujoco.FatalError`` or did not finish.
    The message names the file and what happened; pass a model you trust instead
    (``--model``, ``model=``)."""


class OptionsError(FlyarchiveError, ValueError):
    """An argument or option that cannot be used (a mode, a count, a block of worlds...);
    the message names it, its value and what is allowed."""


class RenderOptionsError(OptionsError):
    """Render options that cannot be used (an unknown backend, a segment of no frames...)."""


class ConfigError(OptionsError):
    """A ``FLYARCHIVE_*`` environment variable holds a value flyarchive cannot use
    (:mod:`flyarchive.config` lists them)."""


class ImportMismatchError(FlyarchiveError, ValueError):
    """An interrupted ``.npz`` import cannot be resumed with these files or this model."""


class OutputLocationError(FlyarchiveError, NotADirectoryError):
    """An output location that must be a folder is a file (or another non-folder)."""


#: The flyarchive extra that installs the fsspec backend of a URL protocol (pyproject.toml);
#: other protocols' packages (gcsfs, adlfs...) are named as they are.
_PROTOCOL_EXTRAS = {"s3": "s3", "s3a": "s3"}


def missing_dependency(package: str, extra: str | None, what: str, *,
                       cause: BaseException | None = None,
                       error: type[MissingDependencyError] = MissingDependencyError
                       ) -> MissingDependencyError:
    """The error for a missing optional dependency, with the one install hint flyarchive gives.

    Every "install X" message of the package is made here, so that they all read alike:
    ``"<what> needs the package 'x', which is not installed (<cause>). Install it with:
    pip install 'flyarchive[extra]'"``.

    Args:
        package: The package that is missing, e.g. ``"s3fs"``.
        extra: The flyarchive extra that installs it, e.g. ``"s3"``; None: the hint
            names the package itself (``pip install <package>``).
        what: What the user asked for that needs it.
        cause: The ImportError that revealed it (its message is quoted), if any.
        error: The class to build: :class:`MissingDependencyError` or a subclass.
    """
    detail = f" ({type(cause).__name__}: {cause})" if cause is not None else ""
    hint = f"pip install 'flyarchive[{extra}]'" if extra else f"pip install {package}"
    if extra == "flygym":
        import mujoco

        if int(mujoco.__version__.split(".")[0]) >= 4:  # flygym 2.1 pins MuJoCo 3.16
            hint = (f"pip install 'flyarchive[{extra}]' in an environment of MuJoCo 3.16 "
                    f"(flygym 2.1 needs it; this one runs MuJoCo {mujoco.__version__}: "
                    "`bash scripts/dev.sh setup` makes one, or see the README's MuJoCo "
                    "releases to move this one)")
    return error(
        f"{what} needs the package {package!r}, which is not installed{detail}. "
        f"Install it with: {hint}"
    )


class UntrustedCacheWarning(UserWarning):
    """flyarchive's cache folder (``FLYARCHIVE_CACHE_DIR``) can be written by someone other
    than this user (another owner, or writable by its group or others): the verdicts and
    compiled models kept there are not trusted, and none is kept there. The message names
    the folder and how to make it private."""


# Not flyarchive errors, not public: what a local file turned out to be, and SIGTERM.
class IrregularFileError(OSError):
    """What :func:`flyarchive.store.localstore.open_regular` found instead of a regular file.

    Attributes:
        problem: What the path is, as a phrase (``"is a FIFO (named pipe), not a regular
            file; ..."``).
        fix: What to do about it, as a sentence.
    """

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(problem)
        self.problem, self.fix = problem, fix


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived (``kill PID``, a scheduler's stop): the command stops as on Ctrl-C,
    keeping what it finished."""


class RenderCancelled(Terminated):
    """A render cancelled from the viewer's page: it stops as on SIGTERM (its partial files
    removed), and the viewer's render thread goes on with the next."""


def another_mujoco_line(warp_version: str, mujoco_version: str) -> str:
    """The warning's text for mujoco-warp of another line than MuJoCo (mujoco-warp is
    made for the MuJoCo of its own release, and declares only ``mujoco>=3.13``), with the
    install that pairs them."""
    warp_line = ".".join(warp_version.split(".")[:2])
    line = ".".join(mujoco_version.split(".")[:2])
    return (f"mujoco-warp {warp_version} is made for MuJoCo {warp_line}, and this environment "
            f"has MuJoCo {mujoco_version}. Install the mujoco-warp of MuJoCo's line: pip install "
            f"'mujoco-warp=={line}.*' (with flygym: pip install 'flyarchive[all]', or "
            "'flygym[warp]', keeps them together).")


def did_you_mean(word: str, choices: Iterable[str], *, n: int = 3) -> str:
    """``" Did you mean 'shoulder'?"`` for the names of ``choices`` closest to ``word``
    (:func:`difflib.get_close_matches`), to append to an error; ``""`` when none is close.

    Args:
        word: The name asked for, e.g. an unknown dof label or world variable.
        choices: The names that exist.
        n: Most names suggested.
    """
    import difflib

    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=n)
    if not close:
        return ""
    return f" Did you mean {' or '.join(map(repr, close))}?"


def missing_storage_backend(url: str, cause: BaseException | None = None
                            ) -> StorageBackendMissingError:
    """The error for a URL whose fsspec protocol needs a package that is not installed.

    Args:
        url: The URL asked for, e.g. ``"s3://lab/run.zarr"``.
        cause: The ImportError fsspec raised, if any.
    """
    from fsspec.registry import known_implementations

    protocol = url.split("://", 1)[0] if "://" in url else "file"
    implementation = str(known_implementations.get(protocol, {}).get("class", ""))
    package = implementation.split(".")[0] or f"an fsspec backend for {protocol!r}"
    error = missing_dependency(package, _PROTOCOL_EXTRAS.get(protocol),
                               f"The URL {url!r} (protocol {protocol!r})", cause=cause,
                               error=StorageBackendMissingError)
    assert isinstance(error, StorageBackendMissingError)
    return error
