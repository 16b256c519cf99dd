"""The brain of nightshift: pure logic, no I/O.

SLO spec, request records, step-latency model, capacity planner and the admission controller live
here. Nothing in this package imports another nightshift package, opens a socket or reads a clock, so
the simulator (virtual time) and the real pipeline (wall time) drive the very same objects.
"""
