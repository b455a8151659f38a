"""NVIDIA's XID catalog as data: every XID, its bucket, what we do about it, and why.

NVIDIA's XID catalog ("Analyzing Xid Errors with the Xid Catalog", Ampere and newer, published
with ``Xid-Catalog.xlsx``) files every XID under an *immediate action* bucket. ``CATALOG`` lists
every XID of that catalog (1-172) with NVIDIA's mnemonic and bucket as written there. Buckets
become node actions once, in ``BUCKET_ACTION``; a row deviates from its bucket only where the
bucket cannot be automated as is, and says why.

The rows are plain values checked by ``load_catalog`` when this module is imported: a bucket
that is not one of ``Bucket`` (a typo, a bucket from a newer catalog) fails the import, and so
the start of the service, with the XID named.

Pure data and pure functions: imported by the Temporal workflow sandbox.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from policy.models import Action

CATALOG_SOURCE = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"


class Bucket(StrEnum):
    """NVIDIA's immediate-action buckets ("resolution buckets") from the XID catalog."""

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
    CHECK_UVM = "CHECK_UVM"
    UPDATE_SWFW = "UPDATE_SWFW"
    CONTACT_SUPPORT = "CONTACT_SUPPORT"
    NO_BUCKET = "NO_BUCKET"
    """Not NVIDIA's: the catalog lists the XID (162-172, the newest) with no immediate action."""

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
    # Where the kernel log gives the registers, NVLink5 lines are decoded (policy/nvlink5.py).
    Bucket.WORKFLOW_NVLINK_ERR: Action.RESET,
    Bucket.WORKFLOW_NVLINK5_ERR: Action.RESET,
    # Fallback only: the rules replace it with the recovery action the driver reports.
    Bucket.XID_154: Action.RESET,
    # Hands-on work (reseat, cables, vendor case): keep the node out until a human releases it.
    Bucket.CHECK_MECHANICALS: Action.QUARANTINE,
    Bucket.CONTACT_SUPPORT: Action.QUARANTINE,
    # A human checks the UVM driver or updates the driver/firmware; neither a reset nor a
    # reboot does that work, and the node can keep serving meanwhile.
    Bucket.CHECK_UVM: Action.ALERT,
    Bucket.UPDATE_SWFW: Action.ALERT,
    # No guidance from NVIDIA: tell a human rather than guess at a drain.
    Bucket.NO_BUCKET: Action.ALERT,
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

    @property
    def deviates(self) -> bool:
        """True when the action is not the bucket's (the why says why)."""
        return self.action != BUCKET_ACTION[self.bucket]


class CatalogError(ValueError):
    """A catalog entry that cannot be used; the message names its XID."""


class Entry(NamedTuple):
    """One catalog entry as written below: NVIDIA's facts, then ours."""

    xid: int
    mnemonic: str
    bucket: str
    why: str
    action: str | None = None
    """Only where we deviate from the bucket's action."""


def load_catalog(entries: Iterable[Entry]) -> dict[int, XidRule]:
    """Check the entries and build the table; the first bad entry raises ``CatalogError``
    naming its XID and what is wrong with it."""
    table: dict[int, XidRule] = {}
    for entry in entries:
        where = f"XID catalog entry {entry.xid} ({entry.mnemonic or 'no mnemonic'})"
        try:
            bucket = Bucket(entry.bucket)
        except ValueError:
            known = ", ".join(b.value for b in Bucket)
            raise CatalogError(
                f"{where}: unknown bucket {entry.bucket!r} (known: {known})"
            ) from None
        try:
            action = BUCKET_ACTION[bucket] if entry.action is None else Action(entry.action)
        except ValueError:
            known = ", ".join(a.value for a in Action)
            raise CatalogError(
                f"{where}: unknown action {entry.action!r} (known: {known})"
            ) from None
        if entry.xid in table:
            raise CatalogError(f"{where}: listed twice")
        if entry.xid < 1 or not entry.mnemonic.strip() or not entry.why.strip():
            raise CatalogError(f"{where}: needs an XID >= 1, a mnemonic and a why")
        if entry.action is not None and action == BUCKET_ACTION[bucket]:
            raise CatalogError(f"{where}: deviation to {action.value} is the bucket's own action")
        table[entry.xid] = XidRule(
            xid=entry.xid, mnemonic=entry.mnemonic, bucket=bucket, action=action, why=entry.why
        )
    return table


# Whys shared by families of XIDs.
_UNUSED = (
    "Unused on Ampere and newer: a GPU that reports it is doing what the catalog does not "
    "expect, so the node waits for a human and the vendor."
)
_CE = "A copy-engine exception in one application's work; the GPU keeps serving the others."
_NVDEC = "A video-decoder engine error in one application's work."
_NVJPG = "A JPEG-decoder engine error in one application's work."
_OFA = "An optical-flow engine error in one application's work."
_DRIVER_FW = "A driver/firmware-internal event the catalog says needs no action."
_NVLINK5 = (
    "NVLink5 error: its subcode decides between ignore and reset. From the kernel log, "
    "NVIDIA's 144-150 decode sheet decides (policy/nvlink5.py); the exporter's gauge lacks "
    "the registers, so from it assume the fatal subcodes and reset."
)
_PSHC = (
    "Power-smoothing circuitry state; no catalog guidance and no GPU fault: a human checks "
    "the board's power smoothing."
)

_E = Entry
CATALOG: tuple[Entry, ...] = (
    _E(1, "ROBUST_CHANNEL_FIFO_ERROR_FIFO_METHOD", "CONTACT_SUPPORT", _UNUSED),
    _E(2, "ROBUST_CHANNEL_FIFO_ERROR_SW_METHOD", "CONTACT_SUPPORT", _UNUSED),
    _E(3, "ROBUST_CHANNEL_FIFO_ERROR_UNK_METHOD", "CONTACT_SUPPORT", _UNUSED),
    _E(4, "ROBUST_CHANNEL_FIFO_ERROR_CHANNEL_BUSY", "CONTACT_SUPPORT", _UNUSED),
    _E(5, "ROBUST_CHANNEL_FIFO_ERROR_RUNOUT_OVERFLOW", "CONTACT_SUPPORT", _UNUSED),
    _E(6, "ROBUST_CHANNEL_FIFO_ERROR_PARSE_ERR", "CONTACT_SUPPORT", _UNUSED),
    _E(7, "ROBUST_CHANNEL_FIFO_ERROR_PTE_ERR", "CONTACT_SUPPORT", _UNUSED),
    _E(8, "ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT", "RESTART_APP",
       "The GPU stopped processing one context; the app restarts."),
    _E(9, "ROBUST_CHANNEL_GR_ERROR_INSTANCE", "CONTACT_SUPPORT", _UNUSED),
    _E(10, "ROBUST_CHANNEL_GR_ERROR_SINGLE_STEP", "CONTACT_SUPPORT", _UNUSED),
    _E(11, "ROBUST_CHANNEL_GR_ERROR_MISSING_HW", "RESTART_APP",
       "An invalid or corrupted push buffer from the app; check the app or CUDA."),
    _E(12, "ROBUST_CHANNEL_GR_ERROR_SW_METHOD", "CONTACT_SUPPORT", _UNUSED),
    _E(13, "ROBUST_CHANNEL_GR_EXCEPTION / ROBUST_CHANNEL_GR_ERROR_SW_NOTIFY", "RESTART_APP",
       "A graphics engine exception, usually an out-of-bounds access in user code; "
       "bursts on one GPU call for a deeper diagnostic."),
    _E(14, "ROBUST_CHANNEL_FAKE_ERROR", "IGNORE", "An injected test error; nothing is wrong."),
    _E(15, "ROBUST_CHANNEL_SCANLINE_TIMEOUT", "CONTACT_SUPPORT", _UNUSED),
    _E(16, "ROBUST_CHANNEL_VBLANK_CALLBACK_TIMEOUT", "CONTACT_SUPPORT", _UNUSED),
    _E(17, "ROBUST_CHANNEL_PARAMETER_ERROR", "CONTACT_SUPPORT", _UNUSED),
    _E(18, "ROBUST_CHANNEL_BUS_MASTER_TIMEOUT_ERROR", "CONTACT_SUPPORT", _UNUSED),
    _E(19, "ROBUST_CHANNEL_DISP_MISSED_NOTIFIER", "CONTACT_SUPPORT", _UNUSED),
    _E(20, "ROBUST_CHANNEL_MPEG_ERROR_SW_METHOD", "CONTACT_SUPPORT", _UNUSED),
    _E(21, "ROBUST_CHANNEL_ME_ERROR_SW_METHOD", "CONTACT_SUPPORT", _UNUSED),
    _E(22, "ROBUST_CHANNEL_VP_ERROR_SW_METHOD", "CONTACT_SUPPORT", _UNUSED),
    _E(23, "ROBUST_CHANNEL_RC_LOGGING_ENABLED", "CONTACT_SUPPORT", _UNUSED),
    _E(24, "ROBUST_CHANNEL_GR_SEMAPHORE_TIMEOUT", "CONTACT_SUPPORT", _UNUSED),
    _E(25, "ROBUST_CHANNEL_GR_ILLEGAL_NOTIFY", "RESTART_APP",
       "An invalid or illegal push buffer from the app; check the app or CUDA."),
    _E(26, "ROBUST_CHANNEL_FIFO_ERROR_FBISTATE_TIMEOUT", "CONTACT_SUPPORT", _UNUSED),
    _E(27, "ROBUST_CHANNEL_VP_ERROR", "CONTACT_SUPPORT", _UNUSED),
    _E(28, "ROBUST_CHANNEL_VP2_ERROR", "CONTACT_SUPPORT", _UNUSED),
    _E(29, "ROBUST_CHANNEL_BSP_ERROR", "CONTACT_SUPPORT", _UNUSED),
    _E(30, "ROBUST_CHANNEL_BAD_ADDR_ACCESS", "CONTACT_SUPPORT", _UNUSED),
    _E(31, "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "RESTART_APP",
       "A GPU memory page fault, normally the app's; bursts on one GPU call for a deeper "
       "diagnostic."),
    _E(32, "ROBUST_CHANNEL_PBDMA_ERROR", "RESTART_APP",
       "A corrupted push-buffer stream; an app matter unless it keeps coming back."),
    _E(33, "ROBUST_CHANNEL_SEC_ERROR", "CONTACT_SUPPORT", _UNUSED),
    _E(34, "ROBUST_CHANNEL_MSVLD_ERROR", "CONTACT_SUPPORT", _UNUSED),
    _E(35, "ROBUST_CHANNEL_MSPDEC_ERROR", "CONTACT_SUPPORT", _UNUSED),
    _E(36, "ROBUST_CHANNEL_MSPPP_ERROR", "CONTACT_SUPPORT", _UNUSED),
    _E(37, "ROBUST_CHANNEL_FECS_ERR_UNIMP_FIRMWARE_METHOD", "IGNORE", _DRIVER_FW),
    _E(38, "ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT", "IGNORE", _DRIVER_FW),
    _E(39, "ROBUST_CHANNEL_CE0_ERROR", "RESTART_APP", _CE),
    _E(40, "ROBUST_CHANNEL_CE1_ERROR", "RESTART_APP", _CE),
    _E(41, "ROBUST_CHANNEL_CE2_ERROR", "RESTART_APP", _CE),
    _E(42, "ROBUST_CHANNEL_VIC_ERROR", "CONTACT_SUPPORT", _UNUSED),
    _E(43, "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "IGNORE",
       "A software-induced fault in one app; the GPU stays healthy."),
    _E(44, "ROBUST_CHANNEL_GR_FAULT_DURING_CTXSW", "IGNORE",
       "A graphics engine fault during a context switch; the catalog says no action."),
    _E(45, "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", "WORKFLOW_XID_45",
       "Channel teardown after kill/Ctrl-C or another error; the primary XID decides."),
    _E(46, "ROBUST_CHANNEL_GPU_TIMEOUT_ERROR", "RESET_GPU",
       "The GPU stopped processing; a reset recovers it."),
    _E(47, "ROBUST_CHANNEL_NVENC0_ERROR", "CONTACT_SUPPORT", _UNUSED),
    _E(48, "ROBUST_CHANNEL_GPU_ECC_DBE", "WORKFLOW_XID_48",
       "Uncorrectable ECC error; the GPU needs a reset to recover and apply row remaps."),
    _E(49, "SILENT_RUNNING_CONSTANT_LEVEL_SET_BY_REGISTRY", "CONTACT_SUPPORT", _UNUSED),
    _E(50, "SILENT_RUNNING_LEVEL_TRANSITION_DUE_TO_RC_ERROR", "CONTACT_SUPPORT", _UNUSED),
    _E(51, "SILENT_RUNNING_STRESS_TEST_FAILURE", "CONTACT_SUPPORT", _UNUSED),
    _E(52, "SILENT_RUNNING_LEVEL_TRANS_DUE_TO_TEMP_RISE", "CONTACT_SUPPORT", _UNUSED),
    _E(53, "SILENT_RUNNING_TEMP_REDUCED_CLOCKING", "CONTACT_SUPPORT", _UNUSED),
    _E(54, "SILENT_RUNNING_PWR_REDUCED_CLOCKING", "CHECK_MECHANICALS",
       "Auxiliary power is not connected; only hands on the machine fix it."),
    _E(55, "SILENT_RUNNING_TEMPERATURE_READ_ERROR", "CONTACT_SUPPORT", _UNUSED),
    _E(56, "DISPLAY_CHANNEL_EXCEPTION", "CONTACT_SUPPORT", _UNUSED),
    _E(57, "FB_LINK_TRAINING_FAILURE_ERROR", "CONTACT_SUPPORT", _UNUSED),
    _E(58, "FB_MEMORY_ERROR", "CONTACT_SUPPORT", _UNUSED),
    _E(59, "PMU_ERROR", "CONTACT_SUPPORT", _UNUSED),
    _E(60, "ROBUST_CHANNEL_SEC2_ERROR", "RESTART_APP",
       "A video processor exception in one app's work."),
    _E(61, "PMU_BREAKPOINT", "CONTACT_SUPPORT", _UNUSED),
    _E(62, "PMU_HALT_ERROR", "RESET_GPU",
       "An internal micro-controller halted; reset restarts it."),
    _E(63, "INFOROM_DRAM_RETIREMENT_EVENT", "IGNORE",
       "A row remap was recorded; the row-remap-pending rule schedules the reset."),
    _E(64, "INFOROM_DRAM_RETIREMENT_FAILURE", "RESET_GPU",
       "Recording a remap failed; reset, then the row-remap-failure flag decides RMA."),
    _E(65, "ROBUST_CHANNEL_NVENC1_ERROR", "CONTACT_SUPPORT", _UNUSED),
    _E(66, "ROBUST_CHANNEL_FECS_ERR_REG_ACCESS_VIOLATION", "IGNORE",
       "An illegal register access by the driver; the catalog says no action."),
    _E(67, "ROBUST_CHANNEL_FECS_ERR_VERIF_VIOLATION", "IGNORE",
       "An illegal access by the driver; the catalog says no action."),
    _E(68, "ROBUST_CHANNEL_NVDEC0_ERROR", "RESTART_APP", _NVDEC),
    _E(69, "ROBUST_CHANNEL_GR_CLASS_ERROR", "RESTART_APP",
       "A graphics engine class error in one app."),
    _E(70, "ROBUST_CHANNEL_CE3_ERROR", "RESTART_APP", _CE),
    _E(71, "ROBUST_CHANNEL_CE4_ERROR", "RESTART_APP", _CE),
    _E(72, "ROBUST_CHANNEL_CE5_ERROR", "RESTART_APP", _CE),
    _E(73, "ROBUST_CHANNEL_NVENC2_ERROR", "CONTACT_SUPPORT", _UNUSED),
    _E(74, "NVLINK_ERROR", "WORKFLOW_NVLINK_ERR",
       "An NVLink error to a peer; a reset (or reboot) clears the link state."),
    _E(75, "ROBUST_CHANNEL_CE6_ERROR", "RESTART_APP", _CE),
    _E(76, "ROBUST_CHANNEL_CE7_ERROR", "RESTART_APP", _CE),
    _E(77, "ROBUST_CHANNEL_CE8_ERROR", "RESTART_APP", _CE),
    _E(78, "VGPU_START_ERROR", "UPDATE_SWFW",
       "A vGPU failed to start; updating driver or firmware is a human's job, a reset is not it."),
    _E(79, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "RESTART_BM",
       "The GPU is gone from PCIe, so no in-band reset can reach it."),
    _E(80, "PBDMA_PUSHBUFFER_CRC_MISMATCH", "RESTART_APP",
       "Corrupted data was sent to the GPU; the app restarts, repeats point at the host path."),
    _E(81, "ROBUST_CHANNEL_VGA_SUBSYSTEM_ERROR", "CONTACT_SUPPORT", _UNUSED),
    _E(82, "ROBUST_CHANNEL_NVJPG0_ERROR", "RESTART_APP", _NVJPG),
    _E(83, "ROBUST_CHANNEL_NVDEC1_ERROR", "RESTART_APP", _NVDEC),
    _E(84, "ROBUST_CHANNEL_NVDEC2_ERROR", "RESTART_APP", _NVDEC),
    _E(85, "ROBUST_CHANNEL_CE9_ERROR", "RESTART_APP", _CE),
    _E(86, "ROBUST_CHANNEL_OFA0_ERROR", "RESTART_APP", _OFA),
    _E(87, "NVTELEMETRY_DRIVER_REPORT", "CONTACT_SUPPORT", _UNUSED),
    _E(88, "ROBUST_CHANNEL_NVDEC3_ERROR", "RESTART_APP", _NVDEC),
    _E(89, "ROBUST_CHANNEL_NVDEC4_ERROR", "RESTART_APP", _NVDEC),
    _E(90, "LTC_ERROR", "CONTACT_SUPPORT", _UNUSED),
    _E(91, "RESERVED_XID", "CONTACT_SUPPORT", _UNUSED),
    _E(92, "EXCESSIVE_SBE_INTERRUPTS", "IGNORE",
       "A high corrected-error rate; corrected errors need no action."),
    _E(93, "INFOROM_ERASE_LIMIT_EXCEEDED", "IGNORE",
       "A non-fatal InfoROM wear limit; informational on current GPUs."),
    _E(94, "ROBUST_CHANNEL_CONTAINED_ERROR", "RESTART_APP",
       "A contained ECC error killed only the faulting app; the pending remap is handled by "
       "the row-remap-pending rule."),
    _E(95, "ROBUST_CHANNEL_UNCONTAINED_ERROR", "RESET_GPU",
       "An uncontained ECC error affected every app on the GPU."),
    _E(96, "ROBUST_CHANNEL_NVDEC5_ERROR", "RESTART_APP", _NVDEC),
    _E(97, "ROBUST_CHANNEL_NVDEC6_ERROR", "RESTART_APP", _NVDEC),
    _E(98, "ROBUST_CHANNEL_NVDEC7_ERROR", "RESTART_APP", _NVDEC),
    _E(99, "ROBUST_CHANNEL_NVJPG1_ERROR", "RESTART_APP", _NVJPG),
    _E(100, "ROBUST_CHANNEL_NVJPG2_ERROR", "RESTART_APP", _NVJPG),
    _E(101, "ROBUST_CHANNEL_NVJPG3_ERROR", "RESTART_APP", _NVJPG),
    _E(102, "ROBUST_CHANNEL_NVJPG4_ERROR", "RESTART_APP", _NVJPG),
    _E(103, "ROBUST_CHANNEL_NVJPG5_ERROR", "RESTART_APP", _NVJPG),
    _E(104, "ROBUST_CHANNEL_NVJPG6_ERROR", "RESTART_APP", _NVJPG),
    _E(105, "ROBUST_CHANNEL_NVJPG7_ERROR", "RESTART_APP", _NVJPG),
    _E(106, "SMBPBI_TEST_MESSAGE", "IGNORE",
       "A test message over the out-of-band SMBus interface; nothing is wrong."),
    _E(107, "SMBPBI_TEST_MESSAGE_SILENT", "IGNORE",
       "A silent test message over the out-of-band SMBus interface; nothing is wrong."),
    _E(108, "NVLINK_REMOTE_TRANSLATION_ERROR", "IGNORE",
       "Unused; the catalog files it with XID 137 (an app's illegal peer access), no action."),
    _E(109, "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", "RESET_GPU",
       "A context-switch timeout; reset recovers."),
    _E(110, "SEC_FAULT_ERROR", "RESET_GPU", "A security fault, likely hardware; reset first."),
    _E(111, "BUNDLE_ERROR_EVENT", "CONTACT_SUPPORT", _UNUSED),
    _E(112, "DISP_SUPERVISOR_ERROR", "CONTACT_SUPPORT", _UNUSED),
    _E(113, "DP_LT_FAILURE", "CONTACT_SUPPORT", _UNUSED),
    _E(114, "HEAD_RG_UNDERFLOW", "CONTACT_SUPPORT", _UNUSED),
    _E(115, "CORE_CHANNEL_REGS", "CONTACT_SUPPORT", _UNUSED),
    _E(116, "WINDOW_CHANNEL_REGS", "CONTACT_SUPPORT", _UNUSED),
    _E(117, "CURSOR_CHANNEL_REGS", "CONTACT_SUPPORT", _UNUSED),
    _E(118, "HEAD_REGS", "CONTACT_SUPPORT", _UNUSED),
    _E(119, "GSP_RPC_TIMEOUT", "RESET_GPU",
       "The GSP firmware stopped answering; reset restarts it."),
    _E(120, "GSP_ERROR", "RESET_GPU", "An error inside the GSP firmware; reset restarts it."),
    _E(121, "C2C_ERROR", "IGNORE",
       "Corrected errors on the Grace-GPU link; corrected means no action now."),
    _E(122, "SPI_PMU_RPC_READ_FAIL", "CONTACT_SUPPORT", _UNUSED),
    _E(123, "SPI_PMU_RPC_WRITE_FAIL", "CONTACT_SUPPORT", _UNUSED),
    _E(124, "SPI_PMU_RPC_ERASE_FAIL", "CONTACT_SUPPORT", _UNUSED),
    _E(125, "INFOROM_FS_ERROR", "CONTACT_SUPPORT", _UNUSED),
    _E(126, "ROBUST_CHANNEL_CE10_ERROR", "RESTART_APP", _CE),
    _E(127, "ROBUST_CHANNEL_CE11_ERROR", "RESTART_APP", _CE),
    _E(128, "ROBUST_CHANNEL_CE12_ERROR", "RESTART_APP", _CE),
    _E(129, "ROBUST_CHANNEL_CE13_ERROR", "RESTART_APP", _CE),
    _E(130, "ROBUST_CHANNEL_CE14_ERROR", "RESTART_APP", _CE),
    _E(131, "ROBUST_CHANNEL_CE15_ERROR", "RESTART_APP", _CE),
    _E(132, "ROBUST_CHANNEL_CE16_ERROR", "RESTART_APP", _CE),
    _E(133, "ROBUST_CHANNEL_CE17_ERROR", "RESTART_APP", _CE),
    _E(134, "ROBUST_CHANNEL_CE18_ERROR", "RESTART_APP", _CE),
    _E(135, "ROBUST_CHANNEL_CE19_ERROR", "RESTART_APP", _CE),
    _E(136, "ALI_TRAINING_FAIL", "RESET_GPU",
       "NVLink training failed; reset retrains the link."),
    _E(137, "NVLINK_PRIV_ERR", "IGNORE",
       "An illegal NVLink peer access, normally caused by the app."),
    _E(138, "ROBUST_CHANNEL_DLA_ERROR", "CONTACT_SUPPORT", _UNUSED),
    _E(139, "ROBUST_CHANNEL_OFA1_ERROR", "RESTART_APP", _OFA),
    _E(140, "UNRECOVERABLE_ECC_ERROR_ESCAPE", "RESET_GPU",
       "An uncorrectable error escaped remapping; reset, recurrence goes to a human."),
    _E(141, "ROBUST_CHANNEL_FAST_PATH_ERROR", "IGNORE",
       "A CUDA fast-path error; the catalog says no action."),
    _E(142, "ROBUST_CHANNEL_NVENC3_ERROR", "CONTACT_SUPPORT",
       "A video-encoder error the catalog sends to the vendor; the node waits for a human."),
    _E(143, "GPU_INIT_ERROR", "RESET_GPU", "The GPU failed to initialise; reset retries."),
    _E(144, "NVLINK_SAW_ERROR", "WORKFLOW_NVLINK5_ERR", _NVLINK5),
    _E(145, "NVLINK_RLW_ERROR", "WORKFLOW_NVLINK5_ERR", _NVLINK5),
    _E(146, "NVLINK_TLW_ERROR", "WORKFLOW_NVLINK5_ERR", _NVLINK5),
    _E(147, "NVLINK_TREX_ERROR", "WORKFLOW_NVLINK5_ERR", _NVLINK5),
    _E(148, "NVLINK_NVLPW_CTRL_ERROR", "WORKFLOW_NVLINK5_ERR", _NVLINK5),
    _E(149, "NVLINK_NETIR_ERROR", "WORKFLOW_NVLINK5_ERR", _NVLINK5),
    _E(150, "NVLINK_MSE_ERROR", "WORKFLOW_NVLINK5_ERR", _NVLINK5),
    _E(151, "ROBUST_CHANNEL_KEY_ROTATION_ERROR", "RESTART_VM",
       "Confidential-computing key rotation failed; the VM (here: the node) restarts."),
    _E(152, "ROBUST_CHANNEL_DLA_SMMU_ERROR", "IGNORE",
       "A deep-learning-accelerator SMMU error; the catalog says no action."),
    _E(153, "ROBUST_CHANNEL_DLA_TIMEOUT", "IGNORE",
       "A deep-learning-accelerator timeout; the catalog says no action."),
    _E(154, "GPU_RECOVERY_ACTION_CHANGED", "XID_154",
       "The driver states the recovery it needs; we follow it, reset when it is unreadable."),
    _E(155, "NVLINK_SW_DEFINED_ERROR", "RESET_GPU", "A link was taken down on purpose; reset."),
    _E(156, "RESOURCE_RETIREMENT_EVENT", "RESET_GPU",
       "A resource was retired; the retirement takes effect at reset."),
    _E(157, "RESOURCE_RETIREMENT_FAILURE", "IGNORE",
       "No repair resources are left: the next fault cannot be absorbed, so it goes to RMA.",
       action="quarantine"),
    _E(158, "GPU_FATAL_TIMEOUT", "RESET_GPU", "A fatal timeout; reset recovers."),
    _E(159, "ROBUST_CHANNEL_CHI_NON_DATA_ERROR", "CHECK_UVM",
       "A CHI non-data error: a human checks the UVM driver; often a side effect of another XID."),
    _E(160, "CHANNEL_RETIREMENT_EVENT", "IGNORE",
       "A channel was retired; the current catalog says no action (an older NVSentinel "
       "mapping said reboot: the catalog wins)."),
    _E(161, "CHANNEL_RETIREMENT_FAILURE", "IGNORE",
       "Retiring a channel failed; the catalog says no action, a software matter."),
    _E(162, "PSHC_REENGAGED", "NO_BUCKET", _PSHC),
    _E(163, "PSHC_DISENGAGED", "NO_BUCKET", _PSHC),
    _E(164, "PSHC_LOW_LIFETIME", "NO_BUCKET", _PSHC),
    _E(165, "PSHC_ZERO_LIFETIME", "NO_BUCKET", _PSHC),
    _E(166, "NVLINK_SECURE_CRYPTO_ERR", "NO_BUCKET",
       "Confidential-computing traffic before the link was set up for encryption; no catalog "
       "guidance, a human checks the configuration."),
    _E(167, "PCIE_FATAL_TIMEOUT", "NO_BUCKET",
       "A fatal PCIe timeout with no catalog guidance yet: a human decides between reset and "
       "reboot; the device plugin already keeps new work off the GPU."),
    _E(168, "REDUCED_GPU_MEMORY_CAPACITY", "NO_BUCKET",
       "Errors in write-protected memory reduced the usable capacity; no catalog guidance, "
       "a human decides."),
    _E(169, "SEC2_HALT_ERROR", "NO_BUCKET",
       "An internal micro-controller halted, as in XID 62, which the catalog resets.",
       action="reset"),
    _E(170, "NVLINK_SECURE_OTHER", "NO_BUCKET",
       "An interrupt seen in confidential-computing mode; no catalog guidance, a human looks."),
    _E(171, "UNCORRECTABLE_DRAM_ERROR", "NO_BUCKET",
       "Detail that follows XID 48 (DRAM); the gauge keeps only the last XID, so it stands "
       "for its 48 and resets like it.",
       action="reset"),
    _E(172, "UNCORRECTABLE_SRAM_ERROR", "NO_BUCKET",
       "Detail that follows XID 48 (SRAM); the gauge keeps only the last XID, so it stands "
       "for its 48 and resets like it.",
       action="reset"),
)
"""Every XID of NVIDIA's catalog (revision read 2025-10; mnemonics and buckets as written there)."""

DEFAULT_XID_TABLE: dict[int, XidRule] = load_catalog(CATALOG)
"""XID -> rule for every catalog XID. XIDs not listed use ``unknown_xid_action`` (alert)."""


class RecoveryAction(BaseModel):
    """One value of NVML's ``nvmlDeviceGpuRecoveryAction_t`` and what we do about it."""

    model_config = ConfigDict(frozen=True)

    code: int
    name: str
    action: Action
    why: str = ""

    @property
    def slug(self) -> str:
        return self.name.lower().replace("_", "-")


RECOVERY_ACTIONS: dict[int, RecoveryAction] = {
    r.code: r
    for r in [
        RecoveryAction(code=0, name="NONE", action=Action.NONE,
                       why="The driver needs nothing."),
        RecoveryAction(code=1, name="GPU_RESET", action=Action.RESET,
                       why="Exactly what the driver asks for."),
        RecoveryAction(code=2, name="NODE_REBOOT", action=Action.REBOOT,
                       why="Exactly what the driver asks for: the OS may be inconsistent."),
        RecoveryAction(code=3, name="DRAIN_P2P", action=Action.RESET,
                       why="Peer traffic must stop; our reset drains the node first, and the "
                           "driver's next answer after the drain is one of the others."),
        RecoveryAction(code=4, name="DRAIN_AND_RESET", action=Action.RESET,
                       why="Reduced capacity until a reset; our reset drains first."),
        RecoveryAction(code=5, name="RECOVER_IMEX_DOMAIN", action=Action.QUARANTINE,
                       why="IMEX domain recovery spans several nodes; one node's reset or "
                           "reboot is not it, so a human coordinates it."),
        RecoveryAction(code=6, name="BUS_RESET", action=Action.REBOOT,
                       why="A PCIe bus reset is not something a Job can do in-band; a reboot "
                           "includes one."),
        RecoveryAction(code=7, name="SYSTEM_REBOOT", action=Action.REBOOT,
                       why="Exactly what the driver asks for."),
    ]
}
"""What the driver's GPU recovery action (XID 154, DCGM field 1523, NVML field 230) asks for.
Codes and names are NVML's ``NVML_GPU_RECOVERY_ACTION_*`` (5 since NVML 595, 6-7 since 615), as
the pinned ``nvidia-ml-py`` binding defines them; a test compares the two."""
