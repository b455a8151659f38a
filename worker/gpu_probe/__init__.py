"""Local GPU probes for ``gpu-remediate check``: NVML (nvidia-ml-py) and ``nvidia-smi -q -x``."""

from worker.gpu_probe.common import (
    CommandResult,
    NoDriverError,
    ProbedGpu,
    ProbeIssue,
    ProbeResult,
    ProbeUnavailable,
    RetiredPages,
    Runner,
    run_command,
)
from worker.gpu_probe.kernel_log import KernelXid, parse_kernel_log, read_kernel_log
from worker.gpu_probe.nvml import NvmlSession, load_pynvml
from worker.gpu_probe.smi import parse_nvidia_smi_xml, probe_nvidia_smi

__all__ = [
    "CommandResult",
    "KernelXid",
    "NoDriverError",
    "NvmlSession",
    "ProbeIssue",
    "ProbeResult",
    "ProbeUnavailable",
    "ProbedGpu",
    "RetiredPages",
    "Runner",
    "load_pynvml",
    "parse_kernel_log",
    "parse_nvidia_smi_xml",
    "probe_nvidia_smi",
    "read_kernel_log",
    "run_command",
]
