"""The executors, one a file (`bench.exec.executor.Executor`)."""
