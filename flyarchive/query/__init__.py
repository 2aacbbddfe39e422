"""Query: archives as lazy, validated, masked ``xarray.Dataset`` s, and selections in them.

- :func:`open_archive` (:mod:`~flyarchive.query.archive`);
- dofs by leg, joint and axis (:mod:`~flyarchive.query.dofs`);
- frames of worlds and time windows to render, also chosen by a ``where`` mask
  (:mod:`~flyarchive.query.selection`), and masks from written conditions
  (:mod:`~flyarchive.query.conditions`).
"""

from flyarchive.query.archive import open_archive
from flyarchive.query.dofs import dof_labels, select_dofs
from flyarchive.query.selection import VideoJob, select_frames

