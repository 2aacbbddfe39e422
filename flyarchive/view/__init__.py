"""The web viewer (``flyarchive view URL``): find the worlds worth watching among
thousands, and watch them, in the browser. Needs ``pip install 'flyarchive[view]'``
(aiohttp); loaded only by the ``view`` command.

Modules (none is public; the command line is the way in):

- :mod:`~flyarchive.view.app`: the command: open the archive and its model, serve, print
  the address with its access token; :class:`~flyarchive.view.app.Viewer` answers the API;
- :mod:`~flyarchive.view.server`: the aiohttp application: token and ``Host`` checks on
  every request, fixed routes, the page's files, the JSON API, videos by job number;
  every refusal one line with its status (400, 408, 409, 413, 429, 503), never a
  traceback;
- :mod:`~flyarchive.view.connections`: the accept loop in front of aiohttp: a budget of
  connections below the descriptor limit, deadlines for a request's head, connections
  that never showed the token closed first;
- :mod:`~flyarchive.view.limits`: the bounds of one viewer (connections, timeouts, what
  one request may cost, the render queue), checked before any work;
- :mod:`~flyarchive.view.logs`: log lines safe for a terminal (control characters
  escaped, the token never printed);
- :mod:`~flyarchive.view.shown_archive`: the viewed archive (opened again when it was replaced),
  its world table columns, states read per world (without dask) and cached, the model;
- :mod:`~flyarchive.view.expressions`: filter expressions over world variables, parsed
  with :mod:`ast` and a whitelist of node kinds (never ``eval``);
- :mod:`~flyarchive.view.table`: filter, sort and page the world table; two of its
  columns as scatter points; the units of the columns that are gait measures;
- :mod:`~flyarchive.view.traces`: dof and keypoint traces, min/max per pixel column, and
  each dof's unit;
- :mod:`~flyarchive.view.gait_panels`: the gait panels' data (each leg's stance intervals, the
  thorax's path, a few measures) by :mod:`flyarchive.analyze.gait` from the gait points
  (kept positions when the archive keeps them), cached per archive, world and window;
- :mod:`~flyarchive.view.geom_poses`: the model's visible geoms for three.js, and their poses
  by forward kinematics (``mujoco.mj_kinematics``);
- :mod:`~flyarchive.view.renders`: render on demand through
  :func:`flyarchive.render_videos`, one warm renderer, progress; a bounded queue that
  serves pages in turn.

The page (``static/``) is plain JavaScript modules with three.js (3D view, orbit controls)
and uPlot (traces), vendored from npm with their licences (``static/vendor/``): nothing
is fetched from the internet at run time. ``app.js`` puts the page together; ``api.js``
is the API as every part of the page calls it (token, the page's id, the archive it
shows, one-line errors): a new panel (a plot) imports it and adds its own module;
``text.js`` shows archive text with its control characters escaped; ``poseframes.js``
keeps the poses of the shown worlds in the page (fetched in blocks after a selection), so
that a cursor move asks the server nothing; ``canvasplot.js`` is a small canvas plot (scales,
axes with units) that ``gait.js`` (the footfall diagram and the paths) and ``scatter.js``
(two world variables, with a brush that filters the table) draw on.

Start-up: the command reads the archive's header only (no xarray, no dask) and listens;
the model loads after the first page's table, on a thread of its own
(:meth:`~flyarchive.view.app.Viewer.warm_up`). States are read without xarray or dask;
the lazy dataset opens only for keypoint traces and the gait panels.
"""
