"""Stand-in for horovod.runner.util.threads.in_thread (used by Horovod's test utilities)."""
import threading


def in_thread(target, args=(), name=None, daemon=True, silent=False):
    thread = threading.Thread(target=target, args=args, name=name, daemon=daemon)
    thread.start()
    return thread
