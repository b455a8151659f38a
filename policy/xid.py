"""The XID catalog as data: what each XID means, NVIDIA's bucket, and what we do about it.

NVIDIA's XID catalog ("Analyzing Xid Errors with the Xid Catalog", Ampere and newer) files every
XID under an *immediate action* bucket. We translate buckets into our node actions once, in
``BUCKET_ACTION``, and only deviate per XID where the catalog's bucket cannot be automated as is
(the deviations carry their reason in ``XidRule.why``).

Pure data and pure functions: imported by the Temporal workflow sandbox.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from policy.models import Action


class Bucket(StrEnum):
    """NVIDIA's immediate-action buckets ("guidance classes") from the XID catalog."""

    IGNORE = "IGNORE"
    RESTART_APP = "RESTART_APP"
    RESET_GPU = "RESET_GPU"
    RESTART_BM = "RESTART_BM"
    RESTART_VM = "RESTART_VM"
    WORKFLOW_XID_48 = "WORKFLOW_XID_48"
    WORKFLOW_XID_45 = "WORKFLOW_XID_45"
    WORKFLOW_NVLINK_ERR = "WORKFLOW_NVLINK_ERR"
    WORKFLOW_NVLINK5_ERR = "WORKFLOW_NVLINK5_ERR"
    XID_154 = "XID_154"
    CHECK_MECHANICALS = "CHECK_MECHANICALS"
    CONTACT_SUPPORT = "CONTACT_SUPPORT"

    @property
    def slug(self) -> str:
        """The bucket as it appears in rule ids: ``RESTART_BM`` -> ``restart-bm``."""
        return self.value.lower().replace("_", "-")


BUCKET_ACTION: dict[Bucket, Action] = {
    Bucket.IGNORE: Action.NONE,
    Bucket.RESTART_APP: Action.APP,
    Bucket.RESET_GPU: Action.RESET,
    Bucket.RESTART_BM: Action.REBOOT,
    # On bare metal the "VM owning the GPU" is the node itself.
    Bucket.RESTART_VM: Action.REBOOT,
    # Solo 48 is RESET_GPU in NVIDIA's workflow; with 63/64 it is drain-and-reset, still a reset.
    Bucket.WORKFLOW_XID_48: Action.RESET,
    # Solo 45 means "restart Fabric Manager", with others "follow the other XID": neither is a
    # node action we can take from a gauge that only shows the last XID.
    Bucket.WORKFLOW_XID_45: Action.NONE,
    # The decode needs the register dump from the kernel log, which the gauge does not carry; a
    # reset is what the catalog prescribes for the fatal outcomes, and it clears link state.
    Bucket.WORKFLOW_NVLINK_ERR: Action.RESET,
    Bucket.WORKFLOW_NVLINK5_ERR: Action.RESET,
    # Fallback only: the rules replace it with the recovery action the driver reports.
    Bucket.XID_154: Action.RESET,
    # Hands-on work (reseat, cables, vendor case): keep the node out until a human releases it.
    Bucket.CHECK_MECHANICALS: Action.QUARANTINE,
    Bucket.CONTACT_SUPPORT: Action.QUARANTINE,
}


class XidRule(BaseModel):
    """One row of the catalog, with our action and the reason for it."""

    model_config = ConfigDict(frozen=True)

    xid: int = Field(ge=1, description="The XID number as the driver reports it.")
    mnemonic: str = Field(description="NVIDIA's short name for the XID.")
    bucket: Bucket = Field(description="NVIDIA's immediate-action bucket.")
    action: Action = Field(description="What the node needs when this XID is new.")
    why: str = Field(description="The reason for the action, in one sentence.")

    @property
    def rule_id(self) -> str:
        """Stable rule id for findings, e.g. ``xid-79-restart-bm``."""
        return f"xid-{self.xid}-{self.bucket.slug}"


def _row(
    xid: int, mnemonic: str, bucket: Bucket, why: str, action: Action | None = None
) -> XidRule:
    return XidRule(
        xid=xid,
        mnemonic=mnemonic,
        bucket=bucket,
        action=BUCKET_ACTION[bucket] if action is None else action,
        why=why,
    )


_B = Bucket
_ROWS: list[XidRule] = [
    _row(
        8,
        "IDLE_TIMEOUT",
        _B.RESTART_APP,
        "The GPU stopped processing one context; the app restarts.",
    ),
    _row(
        13,
        "GR_EXCEPTION",
        _B.RESTART_APP,
        "Usually an out-of-bounds access in user code; repeats on one GPU escalate.",
    ),
    _row(
        31,
        "MMU_ERR_FLT",
        _B.RESTART_APP,
        "A GPU memory page fault, normally the app's; repeats on one GPU escalate.",
    ),
    _row(
        32,
        "PBDMA_ERROR",
        _B.RESTART_APP,
        "A corrupted push-buffer stream; an app matter unless it repeats.",
    ),
    _row(
        43,
        "RESETCHANNEL_VERIF_ERROR",
        _B.IGNORE,
        "A software-induced fault in one app; the GPU stays healthy.",
    ),
    _row(
        45,
        "PREEMPTIVE_REMOVAL",
        _B.WORKFLOW_XID_45,
        "Channel teardown after kill/Ctrl-C or another error; the primary XID decides.",
    ),
    _row(46, "GPU_TIMEOUT_ERROR", _B.RESET_GPU, "The GPU stopped processing; a reset recovers it."),
    _row(
        48,
        "GPU_ECC_DBE",
        _B.WORKFLOW_XID_48,
        "Uncorrectable ECC error; the GPU needs a reset to recover and apply row remaps.",
    ),
    _row(
        54,
        "PWR_REDUCED_CLOCKING",
        _B.CHECK_MECHANICALS,
        "Auxiliary power is not connected; only hands on the machine fix it.",
    ),
    _row(
        61,
        "PMU_BREAKPOINT",
        _B.CONTACT_SUPPORT,
        "Unused on A100 and newer, so seeing it is unexpected and needs a human.",
    ),
    _row(
        62,
        "PMU_HALT_ERROR",
        _B.RESET_GPU,
        "An internal micro-controller halted; reset restarts it.",
    ),
    _row(
        63,
        "INFOROM_DRAM_RETIREMENT_EVENT",
        _B.IGNORE,
        "A row remap was recorded; the row-remap-pending rule schedules the reset.",
    ),
    _row(
        64,
        "INFOROM_DRAM_RETIREMENT_FAILURE",
        _B.RESET_GPU,
        "Recording a remap failed; reset, then the row-remap-failure flag decides RMA.",
    ),
    _row(68, "NVDEC0_ERROR", _B.RESTART_APP, "A video decoder exception in one app."),
    _row(69, "GR_CLASS_ERROR", _B.RESTART_APP, "A graphics engine class error in one app."),
    _row(
        74,
        "NVLINK_ERROR",
        _B.WORKFLOW_NVLINK_ERR,
        "An NVLink error to a peer; a reset (or reboot) clears the link state.",
    ),
    _row(
        79,
        "GPU_HAS_FALLEN_OFF_THE_BUS",
        _B.RESTART_BM,
        "The GPU is gone from PCIe, so no in-band reset can reach it.",
    ),
    _row(
        92,
        "EXCESSIVE_SBE_INTERRUPTS",
        _B.IGNORE,
        "A high corrected-error rate; corrected errors need no action.",
    ),
    _row(93, "INFOROM_ERASE_LIMIT_EXCEEDED", _B.IGNORE, "Informational on current GPUs."),
    _row(
        94,
        "CONTAINED_ERROR",
        _B.RESTART_APP,
        "A contained ECC error killed only the faulting app; the pending remap is handled "
        "by the row-remap-pending rule.",
    ),
    _row(
        95,
        "UNCONTAINED_ERROR",
        _B.RESET_GPU,
        "An uncontained ECC error affected every app on the GPU.",
    ),
    _row(109, "CTXSW_TIMEOUT_ERROR", _B.RESET_GPU, "A context-switch timeout; reset recovers."),
    _row(110, "SEC_FAULT_ERROR", _B.RESET_GPU, "A security fault, likely hardware; reset first."),
    _row(
        119,
        "GSP_RPC_TIMEOUT",
        _B.RESET_GPU,
        "The GSP firmware stopped answering; reset restarts it.",
    ),
    _row(120, "GSP_ERROR", _B.RESET_GPU, "An error inside the GSP firmware; reset restarts it."),
    _row(
        121,
        "C2C_ERROR",
        _B.IGNORE,
        "Corrected errors on the Grace-GPU link; corrected means no action now.",
    ),
    _row(122, "SPI_PMU_RPC_READ_FAIL", _B.CONTACT_SUPPORT, "Unused in the catalog; unexpected."),
    _row(123, "SPI_PMU_RPC_WRITE_FAIL", _B.CONTACT_SUPPORT, "Unused in the catalog; unexpected."),
    _row(124, "SPI_PMU_RPC_ERASE_FAIL", _B.CONTACT_SUPPORT, "Unused in the catalog; unexpected."),
    _row(
        136, "ALI_TRAINING_FAIL", _B.RESET_GPU, "NVLink training failed; reset retrains the link."
    ),
    _row(
        137,
        "NVLINK_PRIV_ERR",
        _B.IGNORE,
        "An illegal NVLink peer access, normally caused by the app.",
    ),
    _row(
        140,
        "UNRECOVERABLE_ECC_ERROR_ESCAPE",
        _B.RESET_GPU,
        "An uncorrectable error escaped remapping; reset, recurrence goes to a human.",
    ),
    _row(143, "GPU_INIT_ERROR", _B.RESET_GPU, "The GPU failed to initialise; reset retries."),
    _row(
        144,
        "NVLINK_SAW_ERROR",
        _B.WORKFLOW_NVLINK5_ERR,
        "NVLink5 error; the gauge lacks the subcode, so assume the fatal case.",
    ),
    _row(
        145,
        "NVLINK_RLW_ERROR",
        _B.WORKFLOW_NVLINK5_ERR,
        "NVLink5 error; the gauge lacks the subcode, so assume the fatal case.",
    ),
    _row(
        146,
        "NVLINK_TLW_ERROR",
        _B.WORKFLOW_NVLINK5_ERR,
        "NVLink5 error; the gauge lacks the subcode, so assume the fatal case.",
    ),
    _row(
        147,
        "NVLINK_TREX_ERROR",
        _B.WORKFLOW_NVLINK5_ERR,
        "NVLink5 error; the gauge lacks the subcode, so assume the fatal case.",
    ),
    _row(
        148,
        "NVLINK_NVLPW_CTRL_ERROR",
        _B.WORKFLOW_NVLINK5_ERR,
        "NVLink5 error; the gauge lacks the subcode, so assume the fatal case.",
    ),
    _row(
        149,
        "NVLINK_NETIR_ERROR",
        _B.WORKFLOW_NVLINK5_ERR,
        "NVLink5 error; the gauge lacks the subcode, so assume the fatal case.",
    ),
    _row(
        150,
        "NVLINK_MSE_ERROR",
        _B.WORKFLOW_NVLINK5_ERR,
        "NVLink5 error; the gauge lacks the subcode, so assume the fatal case.",
    ),
    _row(
        151,
        "KEY_ROTATION_ERROR",
        _B.RESTART_VM,
        "Confidential-computing key rotation failed; the VM (here: the node) restarts.",
    ),
    _row(
        154,
        "GPU_RECOVERY_ACTION_CHANGED",
        _B.XID_154,
        "The driver states the recovery it needs; we follow it, reset when it is unreadable.",
    ),
    _row(155, "NVLINK_SW_DEFINED_ERROR", _B.RESET_GPU, "A link was taken down on purpose; reset."),
    _row(
        156,
        "RESOURCE_RETIREMENT_EVENT",
        _B.RESET_GPU,
        "A resource was retired; the retirement takes effect at reset.",
    ),
    _row(
        157,
        "RESOURCE_RETIREMENT_FAILURE",
        _B.IGNORE,
        "No repair resources are left: the next fault cannot be absorbed, so it goes to RMA.",
        action=Action.QUARANTINE,
    ),
    _row(158, "GPU_FATAL_TIMEOUT", _B.RESET_GPU, "A fatal timeout; reset recovers."),
    _row(
        171,
        "UNCORRECTABLE_DRAM_ERROR",
        _B.WORKFLOW_XID_48,
        "Detail that accompanies XID 48 for DRAM; handled like 48.",
    ),
    _row(
        172,
        "UNCORRECTABLE_SRAM_ERROR",
        _B.WORKFLOW_XID_48,
        "Detail that accompanies XID 48 for SRAM; handled like 48.",
    ),
]

DEFAULT_XID_TABLE: dict[int, XidRule] = {row.xid: row for row in _ROWS}
"""Every XID we have a catalog entry for. XIDs not listed use ``unknown_xid_action``."""


class RecoveryAction(BaseModel):
    """One value of NVML's ``nvmlDeviceGpuRecoveryAction_t`` and what we do about it."""

    model_config = ConfigDict(frozen=True)

    code: int
    name: str
    action: Action

    @property
    def slug(self) -> str:
        return self.name.lower().replace("_", "-")


RECOVERY_ACTIONS: dict[int, RecoveryAction] = {
    r.code: r
    for r in [
        RecoveryAction(code=0, name="NONE", action=Action.NONE),
        RecoveryAction(code=1, name="GPU_RESET", action=Action.RESET),
        RecoveryAction(code=2, name="NODE_REBOOT", action=Action.REBOOT),
        # Draining peers and resetting is what our reset workflow does anyway (drain first).
        RecoveryAction(code=3, name="DRAIN_P2P", action=Action.RESET),
        RecoveryAction(code=4, name="DRAIN_AND_RESET", action=Action.RESET),
        # IMEX domain recovery spans several nodes; one node's reset or reboot is not it.
        RecoveryAction(code=5, name="RECOVER_IMEX_DOMAIN", action=Action.QUARANTINE),
        # A bus reset is not something we can do in-band; a reboot includes one.
        RecoveryAction(code=6, name="BUS_RESET", action=Action.REBOOT),
        RecoveryAction(code=7, name="SYSTEM_REBOOT", action=Action.REBOOT),
    ]
}
"""What the driver's GPU recovery action (XID 154, DCGM field 1523, NVML field 230) asks for."""
