"""Driving the Dissector: capture files, --jobs workers, live capture, the live session.

The layer above kwinspect.dissect and below the front ends (cli, tui, spark):
loop.PacketLoop is the one loop; files, parallel and live feed it from their sources.
"""
