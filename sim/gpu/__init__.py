"""Simulated dcgm-exporter for a GPU fleet, with fault injection (no real GPUs needed).

Modules: faults (kinds, defaults, validation), fleet (state and repairs), exposition
(Prometheus text), server (aiohttp app), client (sync control client), cli (typer app).
"""
