"""Load generation: arrival processes, traces, load profiles, the Schedule, and the drivers that replay it."""
