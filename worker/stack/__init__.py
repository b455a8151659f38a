"""The laptop stack behind ``gpu-remediate up``: the Temporal dev server, both simulators,
the worker and the detector as processes on free ports, with the hooks the end-to-end and
chaos tests use to kill and restart them (``local``)."""

from worker.stack.local import LocalStack, Part, Ports, StackError, free_port, up_banner

__all__ = ["LocalStack", "Part", "Ports", "StackError", "free_port", "up_banner"]
