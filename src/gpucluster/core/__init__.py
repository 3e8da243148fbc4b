"""The pure scheduling core: no I/O, no threads, no clock reads.

Everything here is a function of its arguments so the live head and the simulator run the very
same decisions; `now` is always a parameter.
"""
