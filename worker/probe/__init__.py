"""The node-local probe: ``gpu-remediate check`` reads this machine's GPUs (NVML through
nvidia-ml-py, else ``nvidia-smi -q -x``, plus the kernel log's XIDs) and ``evaluate`` judges a
saved exporter scrape; both print the verdict the detector would reach. Neither needs
Temporal or the Kubernetes API.

``check`` the command, ``exit_codes`` what it exits with, ``evaluate`` the offline judgement,
``nvml``, ``smi`` and ``kernel_log`` the probes, ``common`` what they share.
"""
