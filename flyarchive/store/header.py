"""An archive's header: what a render plans with, read without xarray or dask.

Importing xarray and dask (xarray imports ``dask.array`` as it makes its first variable,
whenever dask is installed) is 1-2.5 s of a render's start, under the same GIL as the
import of the Warp renderer (1.2 s on a 2-core VM, 3 s on an H200 host). A render
without a ``where`` mask needs only the attributes, ``n_frames``, the coordinates and
the per-world variables: :func:`flyarchive.store.dataset.open_header` reads them as
:func:`~flyarchive.query.archive.open_archive` does (same checks, same schema
validation, same values), into an :class:`ArchiveHeader`, which answers the part of
:class:`xarray.Dataset`'s interface that the planning code and
:func:`flyarchive.schema.validate` use: ``attrs``, ``ds[name]`` and ``ds.name``
(``.dims``, ``.dtype``, ``.shape``, ``.attrs``, ``.values``), ``name in ds``,
``variables``, ``coords``, ``data_vars`` and ``sizes``. State variables (``qpos``,
mocap poses) have no values here: reading them takes :func:`open_archive`.

This module imports nothing heavy (numpy only).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from typing import TypeAlias

    import xarray as xr

    #: What planning code reads: an archive's dataset or its header (for annotations).
    Archive: TypeAlias = "xr.Dataset | ArchiveHeader"


class HeaderVariable:
    """One variable of an :class:`ArchiveHeader`: dims, dtype, shape, attributes, and its
    values, given or read on first use (``read``); state variables have none."""

    def __init__(self, name: str, dims: tuple[str, ...], dtype: np.dtype, shape: tuple[int, ...],
                 attrs: Mapping[str, Any], *, values: np.ndarray | None = None,
                 read: Callable[[], np.ndarray] | None = None) -> None:
        self.name, self.dims, self.dtype, self.shape = name, tuple(dims), dtype, tuple(shape)
        self.attrs = dict(attrs)
        self._values, self._read = values, read

    @property
    def values(self) -> np.ndarray:
        """The values (read once).

        Raises:
            TypeError: a state variable, which only :func:`open_archive` reads.
        """
        if self._values is None:
            if self._read is None:
                raise TypeError(
                    f"{self.name!r} is state: an archive's header does not read it. Open the "
                    "archive with flyarchive.open_archive(url) to read it.")
            self._values = np.asarray(self._read())
        return self._values

    def __repr__(self) -> str:
        return f"<HeaderVariable {self.name!r} {self.dims} {self.dtype}>"


class ArchiveHeader:
    """The archive's attributes and variables, as planning code reads an
    :class:`xarray.Dataset` (see the module's text).

    Attributes:
        attrs: The archive's attributes.
        variables: Every variable, coordinates included, by name.
        group: The opened, checked zarr group it was read through (None when built
            without one): what reads more of the same archive (its states, its kept model)
            without opening it again.
    """

    def __init__(self, attrs: Mapping[str, Any], variables: Mapping[str, HeaderVariable],
                 coords: tuple[str, ...], group: Any = None) -> None:
        self.attrs = dict(attrs)
        self.variables = dict(variables)
        self._coords = tuple(coords)
        self.group = group

    @property
    def coords(self) -> dict[str, HeaderVariable]:
        """The coordinates (variables named after their dimension)."""
        return {n: self.variables[n] for n in self._coords}

    @property
    def data_vars(self) -> dict[str, HeaderVariable]:
        """The variables that are not coordinates."""
        return {n: v for n, v in self.variables.items() if n not in self._coords}

    @property
    def sizes(self) -> dict[str, int]:
        """The length of each dimension."""
        return {d: n for v in self.variables.values() for d, n in zip(v.dims, v.shape)}

    def __contains__(self, name: object) -> bool:
        return name in self.variables

    def __getitem__(self, name: str) -> HeaderVariable:
        try:
            return self.variables[name]
        except KeyError:
            raise KeyError(f"The archive has no variable {name!r}.") from None

    def __getattr__(self, name: str) -> HeaderVariable:
        variables = self.__dict__.get("variables", {})
        if name in variables:
            return variables[name]
        raise AttributeError(f"{type(self).__name__!r} has no attribute or variable {name!r}")

    def __repr__(self) -> str:
        return f"<ArchiveHeader {self.sizes} variables={sorted(self.variables)}>"
