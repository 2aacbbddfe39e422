"""flyarchive: record MuJoCo kinematic state into xarray/zarr archives, render video later."""
