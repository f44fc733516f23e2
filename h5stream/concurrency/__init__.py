"""The concurrency primitives: the one stoppable wait, the process-pool core, lean spawned processes, Ctrl-C
held to safe points, fork safety, the usable cores."""
