"""sa_jobqueue.ops."""
