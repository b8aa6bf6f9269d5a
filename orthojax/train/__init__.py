"""Sharded training framework: config, mesh, data, checkpoints, metrics, loop."""
