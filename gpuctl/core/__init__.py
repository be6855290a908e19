"""Plain data about GPUs and nodes: standard library only, no I/O, no gpuctl imports."""
