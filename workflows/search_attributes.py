"""Custom search attributes, registered wherever the project starts a server."""

from temporalio.common import SearchAttributeKey

GPU_NODE = SearchAttributeKey.for_keyword("GpuNode")
REMEDIATION_STATE = SearchAttributeKey.for_keyword("RemediationState")
REMEDIATION_ACTION = SearchAttributeKey.for_keyword("RemediationAction")

ALL = (GPU_NODE, REMEDIATION_STATE, REMEDIATION_ACTION)
