"""The node watcher (``gpu-remediate watch``): a DaemonSet, off by default, that reads its
own node's kernel log (``/dev/kmsg``) and, where NVML is present, its XID events, and reports
each XID to the worker over HTTPS at once, with the pod's projected ServiceAccount token.

``follow`` reads the log (the device or a file that grows), ``nvml_events`` the NVML XID
events, ``reporter`` sends (bounded queue, rate limit, retries with backoff; it never blocks
the reading), ``watcher`` joins them. It needs neither Temporal nor the Kubernetes API.
"""

from worker.watch.watcher import WatchSettings, run_watch

__all__ = ["WatchSettings", "run_watch"]
