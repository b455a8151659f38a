"""The steps of RemediationWorkflow (workflows/remediation.py), one family per module.

Each module holds one mixin of ``RemediationBase`` (base.py: the workflow's state and the
call helpers); the workflow class mixes them all and keeps the flow. Workflow code: no I/O
imports, deterministic, imported inside Temporal's sandbox like the workflow itself.
"""
