"""The runtime: a model file made ready to run and run on one GPU plus the host (load and Model, the loader,
the memory plan, the CPU expert pool, the GPU engine and the geometry it reads, PLE rows, host facts)."""
