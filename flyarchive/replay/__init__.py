"""Replay recorded kinematic state: position-only kinematics, then rasterize."""
