"""NVIDIA's XID catalog as data: each XID code and the resolution bucket NVIDIA publishes for it.

Source: NVIDIA, "Analyzing Xid Errors with the Xid Catalog" (the catalog for Ampere and newer,
column "Resolution Bucket (Immediate Action)"), and for the rows from 14 on NVIDIA's
machine-readable copy shipped with NVSentinel; ``docs/metrics.md`` ("The XID catalog") gives
the addresses, the commit and which rows were confirmed where.

An XID not in the table is ``UNKNOWN`` (light, its raw code in the evidence): on purpose 154
(no bucket of its own), display-only and unused codes, and codes above 162.

The tier and recovery plan of each bucket are policy (``xid_buckets`` in policy.yaml), not here:
this module only says what NVIDIA says.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class XidBucket(StrEnum):
    """NVIDIA's resolution buckets (immediate action), plus ``UNKNOWN`` for codes not listed."""

    RESTART_APP = "RESTART_APP"  # the application that hit it must restart; the GPU is fine
    RESET_GPU = "RESET_GPU"  # the GPU needs a reset before it is used again
    RESTART_BM = "RESTART_BM"  # reboot the node (bare metal)
    RESTART_VM = "RESTART_VM"  # restart the virtual machine
    CONTACT_SUPPORT = "CONTACT_SUPPORT"  # unexpected: collect a bug report, call NVIDIA
    IGNORE = "IGNORE"  # informational, no action
    UPDATE_SWFW = "UPDATE_SWFW"  # update driver / firmware
    CHECK_MECHANICALS = "CHECK_MECHANICALS"  # power, cooling, seating
    CHECK_UVM = "CHECK_UVM"  # unified-memory (CPU-GPU coherence) issue
    WORKFLOW_XID_45 = "WORKFLOW_XID_45"  # preemptive cleanup: look at what came before
    WORKFLOW_XID_48 = "WORKFLOW_XID_48"  # double-bit ECC: NVIDIA's DBE workflow
    WORKFLOW_NVLINK_ERR = "WORKFLOW_NVLINK_ERR"  # NVLink error workflow
    WORKFLOW_NVLINK5_ERR = "WORKFLOW_NVLINK5_ERR"  # NVLink 5 (Blackwell) error workflow
    UNKNOWN = "UNKNOWN"  # not in this table (RLGuard's, not NVIDIA's)


@dataclass(frozen=True, slots=True)
class XidEntry:
    code: int
    mnemonic: str
    bucket: XidBucket


B = XidBucket
_ROWS: tuple[tuple[int, str, XidBucket], ...] = (
    (8, "ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT", B.RESTART_APP),
    (11, "ROBUST_CHANNEL_GR_ERROR_MISSING_HW", B.RESTART_APP),
    (13, "ROBUST_CHANNEL_GR_EXCEPTION", B.RESTART_APP),
    (25, "ROBUST_CHANNEL_GR_ILLEGAL_NOTIFY", B.RESTART_APP),
    (31, "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", B.RESTART_APP),
    (32, "ROBUST_CHANNEL_PBDMA_ERROR", B.RESTART_APP),
    (38, "ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT", B.IGNORE),
    (43, "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", B.IGNORE),
    (44, "ROBUST_CHANNEL_GR_FAULT_DURING_CTXSW", B.IGNORE),
    (45, "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", B.WORKFLOW_XID_45),
    (46, "ROBUST_CHANNEL_GPU_TIMEOUT_ERROR", B.RESET_GPU),
    (48, "ROBUST_CHANNEL_GPU_ECC_DBE", B.WORKFLOW_XID_48),
    (54, "SILENT_RUNNING_PWR_REDUCED_CLOCKING", B.CHECK_MECHANICALS),
    (61, "PMU_BREAKPOINT", B.CONTACT_SUPPORT),
    (62, "PMU_HALT_ERROR", B.RESET_GPU),
    (63, "INFOROM_DRAM_RETIREMENT_EVENT", B.IGNORE),
    (64, "INFOROM_DRAM_RETIREMENT_FAILURE", B.RESET_GPU),
    (68, "ROBUST_CHANNEL_NVDEC0_ERROR", B.RESTART_APP),
    (69, "ROBUST_CHANNEL_GR_CLASS_ERROR", B.RESTART_APP),
    (74, "NVLINK_ERROR", B.WORKFLOW_NVLINK_ERR),
    (78, "VGPU_START_ERROR", B.UPDATE_SWFW),
    (79, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", B.RESTART_BM),
    (80, "PBDMA_PUSHBUFFER_CRC_MISMATCH", B.RESTART_APP),
    (92, "EXCESSIVE_SBE_INTERRUPTS", B.IGNORE),
    (93, "INFOROM_ERASE_LIMIT_EXCEEDED", B.IGNORE),
    (94, "ROBUST_CHANNEL_CONTAINED_ERROR", B.RESTART_APP),
    (95, "ROBUST_CHANNEL_UNCONTAINED_ERROR", B.RESET_GPU),
    (109, "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", B.RESET_GPU),
    (110, "SEC_FAULT_ERROR", B.RESET_GPU),
    (119, "GSP_RPC_TIMEOUT", B.RESET_GPU),
    (120, "GSP_ERROR", B.RESET_GPU),
    (121, "C2C_ERROR", B.IGNORE),
    (136, "ALI_TRAINING_FAIL", B.RESET_GPU),
    (140, "UNRECOVERABLE_ECC_ERROR_ESCAPE", B.RESET_GPU),
    (143, "GPU_INIT_ERROR", B.RESET_GPU),
    (144, "NVLINK_SAW_ERROR", B.WORKFLOW_NVLINK5_ERR),
    (145, "NVLINK_RLW_ERROR", B.WORKFLOW_NVLINK5_ERR),
    (146, "NVLINK_TLW_ERROR", B.WORKFLOW_NVLINK5_ERR),
    (147, "NVLINK_TREX_ERROR", B.WORKFLOW_NVLINK5_ERR),
    (148, "NVLINK_NVLPW_CTRL_ERROR", B.WORKFLOW_NVLINK5_ERR),
    (149, "NVLINK_NETIR_ERROR", B.WORKFLOW_NVLINK5_ERR),
    (150, "NVLINK_MSE_ERROR", B.WORKFLOW_NVLINK5_ERR),
    (151, "ROBUST_CHANNEL_KEY_ROTATION_ERROR", B.RESTART_VM),
    (155, "NVLINK_SW_DEFINED_ERROR", B.RESET_GPU),
    (156, "RESOURCE_RETIREMENT_EVENT", B.RESET_GPU),
    (157, "RESOURCE_RETIREMENT_FAILURE", B.IGNORE),
    (158, "GPU_FATAL_TIMEOUT", B.RESET_GPU),
    (159, "ROBUST_CHANNEL_CHI_NON_DATA_ERROR", B.CHECK_UVM),
    (160, "CHANNEL_RETIREMENT_EVENT", B.RESTART_BM),
    (161, "CHANNEL_RETIREMENT_FAILURE", B.IGNORE),
)

XID_CATALOG: dict[int, XidEntry] = {code: XidEntry(code, name, b) for code, name, b in _ROWS}


def entry_of(code: int) -> XidEntry:
    """The catalog entry of ``code``; a code not in the table is ``UNKNOWN``."""
    return XID_CATALOG.get(code) or XidEntry(code, "not in RLGuard's XID catalog", B.UNKNOWN)


def bucket_of(code: int) -> XidBucket:
    return entry_of(code).bucket
