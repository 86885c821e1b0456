"""NVIDIA's Xid catalogue, whole, with the blame class each Xid carries for a rented GPU.

Used by `signatures.py` (the Xid signatures are built from `XID_CLASSES`). Pure data.

Source: NVIDIA's Xid catalogue (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html: code, mnemonic,
"Resolution Bucket (Immediate Action)"), as NVIDIA ships it machine-readable in NVIDIA/NVSentinel
`distros/kubernetes/nvsentinel/charts/gpu-health-monitor/xiderrorsmapping.csv` at
6f8b0fcfa8e502bdda78fabf96facef729a9285b (code, mnemonic, immediate action, FATAL/NONFATAL). Each row below is
that CSV's row (154's free-text action written as FOLLOW_OTHER_XID).

NVIDIA's immediate action says what to do next, not who is at fault (RESTART_APP is also the action for a
contained ECC error, Xid 94), so the class is decided per Xid:
- application (blame image): the catalogue describes the Xid as a fault of the application's own GPU work
  (13 graphics/SM exception: "out-of-bounds ... illegal instruction"; 31 MMU fault: an illegal address; 43 the
  channel was reset after an application fault; 69 illegal class/method; 11 and 25 invalid push-buffer or notify
  from the application). On our rentals the only GPU application is our cuzk build: our software.
- memory (blame machine): uncorrectable or retired GPU memory (48 DBE, 63/64 row remap / page retirement,
  92 excessive SBE, 94/95 contained/uncontained ECC, 140 ECC escape, 156/157 resource retirement, 58 FB memory).
- bus (machine): 79, the GPU fell off the PCIe bus.
- gsp (machine): 119/120, the GPU System Processor stopped answering or failed.
- hardware (machine): every other Xid NVIDIA marks FATAL (reset the GPU, reboot, check mechanicals, NVLink
  workflows, report to NVIDIA), plus 80 (push-buffer CRC mismatch: data corrupted on the way to the GPU),
  154 (the driver says the GPU now needs a reset or reboot) and 161 (channel retirement failed).
- ambiguous (blame unknown): NONFATAL engine exceptions the driver recovered by tearing the channel down
  (8 idle timeout, 32 PBDMA, copy-engine and SEC2 errors, 45 preemptive cleanup after an earlier error, ...):
  our kernel or the GPU may have caused them; never decisive alone (the breaker correlates them across
  machines, a decisive line elsewhere in the evidence wins).
- not-a-failure: 14 (a fake error injected for testing) and 106/107 (SMBPBI test messages): never a cause.
"""

from __future__ import annotations

from dataclasses import dataclass

XID_CATALOGUE_SOURCE = ("NVIDIA Xid catalogue via NVIDIA/NVSentinel@6f8b0fcfa8e502bdda78fabf96facef729a9285b "
                        "distros/kubernetes/nvsentinel/charts/gpu-health-monitor/xiderrorsmapping.csv")

#: (Xid, mnemonic, NVIDIA's immediate action, FATAL) for every Xid of the catalogue.
XID_CATALOGUE: tuple[tuple[int, str, str, bool], ...] = (
    (1, 'ROBUST_CHANNEL_FIFO_ERROR_FIFO_METHOD', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (2, 'ROBUST_CHANNEL_FIFO_ERROR_SW_METHOD', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (3, 'ROBUST_CHANNEL_FIFO_ERROR_UNK_METHOD', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (4, 'ROBUST_CHANNEL_FIFO_ERROR_CHANNEL_BUSY', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (5, 'ROBUST_CHANNEL_FIFO_ERROR_RUNOUT_OVERFLOW', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (6, 'ROBUST_CHANNEL_FIFO_ERROR_PARSE_ERR', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (7, 'ROBUST_CHANNEL_FIFO_ERROR_PTE_ERR', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (8, 'ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT', 'RESTART_APP', False),
    (9, 'ROBUST_CHANNEL_GR_ERROR_INSTANCE', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (10, 'ROBUST_CHANNEL_GR_ERROR_SINGLE_STEP', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (11, 'ROBUST_CHANNEL_GR_ERROR_MISSING_HW', 'RESTART_APP', False),
    (12, 'ROBUST_CHANNEL_GR_ERROR_SW_METHOD', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (13, 'ROBUST_CHANNEL_GR_EXCEPTION / ROBUST_CHANNEL_GR_ERROR_SW_NOTIFY', 'RESTART_APP', False),
    (14, 'ROBUST_CHANNEL_FAKE_ERROR', 'IGNORE', False),
    (15, 'ROBUST_CHANNEL_SCANLINE_TIMEOUT', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (16, 'ROBUST_CHANNEL_VBLANK_CALLBACK_TIMEOUT', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (17, 'ROBUST_CHANNEL_PARAMETER_ERROR', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (18, 'ROBUST_CHANNEL_BUS_MASTER_TIMEOUT_ERROR', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (19, 'ROBUST_CHANNEL_DISP_MISSED_NOTIFIER', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (20, 'ROBUST_CHANNEL_MPEG_ERROR_SW_METHOD', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (21, 'ROBUST_CHANNEL_ME_ERROR_SW_METHOD', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (22, 'ROBUST_CHANNEL_VP_ERROR_SW_METHOD', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (23, 'ROBUST_CHANNEL_RC_LOGGING_ENABLED', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (24, 'ROBUST_CHANNEL_GR_SEMAPHORE_TIMEOUT', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (25, 'ROBUST_CHANNEL_GR_ILLEGAL_NOTIFY', 'RESTART_APP', False),
    (26, 'ROBUST_CHANNEL_FIFO_ERROR_FBISTATE_TIMEOUT', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (27, 'ROBUST_CHANNEL_VP_ERROR', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (28, 'ROBUST_CHANNEL_VP2_ERROR', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (29, 'ROBUST_CHANNEL_BSP_ERROR', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (30, 'ROBUST_CHANNEL_BAD_ADDR_ACCESS', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (31, 'ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT', 'RESTART_APP', False),
    (32, 'ROBUST_CHANNEL_PBDMA_ERROR', 'RESTART_APP', False),
    (33, 'ROBUST_CHANNEL_SEC_ERROR', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (34, 'ROBUST_CHANNEL_MSVLD_ERROR', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (35, 'ROBUST_CHANNEL_MSPDEC_ERROR', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (36, 'ROBUST_CHANNEL_MSPPP_ERROR', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (37, 'ROBUST_CHANNEL_FECS_ERR_UNIMP_FIRMWARE_METHOD', 'IGNORE', False),
    (38, 'ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT', 'IGNORE', False),
    (39, 'ROBUST_CHANNEL_CE0_ERROR', 'RESTART_APP', False),
    (40, 'ROBUST_CHANNEL_CE1_ERROR', 'RESTART_APP', False),
    (41, 'ROBUST_CHANNEL_CE2_ERROR', 'RESTART_APP', False),
    (42, 'ROBUST_CHANNEL_VIC_ERROR', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (43, 'ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR', 'IGNORE', False),
    (44, 'ROBUST_CHANNEL_GR_FAULT_DURING_CTXSW', 'IGNORE', False),
    (45, 'ROBUST_CHANNEL_PREEMPTIVE_REMOVAL', 'WORKFLOW_XID_45', False),
    (46, 'ROBUST_CHANNEL_GPU_TIMEOUT_ERROR', 'RESET_GPU', True),
    (47, 'ROBUST_CHANNEL_NVENC0_ERROR', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (48, 'ROBUST_CHANNEL_GPU_ECC_DBE', 'WORKFLOW_XID_48', True),
    (49, 'SILENT_RUNNING_CONSTANT_LEVEL_SET_BY_REGISTRY', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (50, 'SILENT_RUNNING_LEVEL_TRANSITION_DUE_TO_RC_ERROR', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (51, 'SILENT_RUNNING_STRESS_TEST_FAILURE', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (52, 'SILENT_RUNNING_LEVEL_TRANS_DUE_TO_TEMP_RISE', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (53, 'SILENT_RUNNING_TEMP_REDUCED_CLOCKING', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (54, 'SILENT_RUNNING_PWR_REDUCED_CLOCKING', 'CHECK_MECHANICALS', True),
    (55, 'SILENT_RUNNING_TEMPERATURE_READ_ERROR', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (56, 'DISPLAY_CHANNEL_EXCEPTION', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (57, 'FB_LINK_TRAINING_FAILURE_ERROR', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (58, 'FB_MEMORY_ERROR', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (59, 'PMU_ERROR', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (60, 'ROBUST_CHANNEL_SEC2_ERROR', 'RESTART_APP', False),
    (61, 'PMU_BREAKPOINT', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (62, 'PMU_HALT_ERROR', 'RESET_GPU', True),
    (63, 'INFOROM_DRAM_RETIREMENT_EVENT', 'IGNORE', False),
    (64, 'INFOROM_DRAM_RETIREMENT_FAILURE', 'RESET_GPU', True),
    (65, 'ROBUST_CHANNEL_NVENC1_ERROR', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (66, 'ROBUST_CHANNEL_FECS_ERR_REG_ACCESS_VIOLATION', 'IGNORE', False),
    (67, 'ROBUST_CHANNEL_FECS_ERR_VERIF_VIOLATION', 'IGNORE', False),
    (68, 'ROBUST_CHANNEL_NVDEC0_ERROR', 'RESTART_APP', False),
    (69, 'ROBUST_CHANNEL_GR_CLASS_ERROR', 'RESTART_APP', False),
    (70, 'ROBUST_CHANNEL_CE3_ERROR', 'RESTART_APP', False),
    (71, 'ROBUST_CHANNEL_CE4_ERROR', 'RESTART_APP', False),
    (72, 'ROBUST_CHANNEL_CE5_ERROR', 'RESTART_APP', False),
    (73, 'ROBUST_CHANNEL_NVENC2_ERROR', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (74, 'NVLINK_ERROR', 'WORKFLOW_NVLINK_ERR', True),
    (75, 'ROBUST_CHANNEL_CE6_ERROR', 'RESTART_APP', False),
    (76, 'ROBUST_CHANNEL_CE7_ERROR', 'RESTART_APP', False),
    (77, 'ROBUST_CHANNEL_CE8_ERROR', 'RESTART_APP', False),
    (78, 'VGPU_START_ERROR', 'UPDATE_SWFW', True),
    (79, 'ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS', 'RESTART_BM', True),
    (80, 'PBDMA_PUSHBUFFER_CRC_MISMATCH', 'RESTART_APP', False),
    (81, 'ROBUST_CHANNEL_VGA_SUBSYSTEM_ERROR', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (82, 'ROBUST_CHANNEL_NVJPG0_ERROR', 'RESTART_APP', False),
    (83, 'ROBUST_CHANNEL_NVDEC1_ERROR', 'RESTART_APP', False),
    (84, 'ROBUST_CHANNEL_NVDEC2_ERROR', 'RESTART_APP', False),
    (85, 'ROBUST_CHANNEL_CE9_ERROR', 'RESTART_APP', False),
    (86, 'ROBUST_CHANNEL_OFA0_ERROR', 'RESTART_APP', False),
    (87, 'NVTELEMETRY_DRIVER_REPORT', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (88, 'ROBUST_CHANNEL_NVDEC3_ERROR', 'RESTART_APP', False),
    (89, 'ROBUST_CHANNEL_NVDEC4_ERROR', 'RESTART_APP', False),
    (90, 'LTC_ERROR', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (91, 'RESERVED_XID', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (92, 'EXCESSIVE_SBE_INTERRUPTS', 'IGNORE', False),
    (93, 'INFOROM_ERASE_LIMIT_EXCEEDED', 'IGNORE', False),
    (94, 'ROBUST_CHANNEL_CONTAINED_ERROR', 'RESTART_APP', False),
    (95, 'ROBUST_CHANNEL_UNCONTAINED_ERROR', 'RESET_GPU', True),
    (96, 'ROBUST_CHANNEL_NVDEC5_ERROR', 'RESTART_APP', False),
    (97, 'ROBUST_CHANNEL_NVDEC6_ERROR', 'RESTART_APP', False),
    (98, 'ROBUST_CHANNEL_NVDEC7_ERROR', 'RESTART_APP', False),
    (99, 'ROBUST_CHANNEL_NVJPG1_ERROR', 'RESTART_APP', False),
    (100, 'ROBUST_CHANNEL_NVJPG2_ERROR', 'RESTART_APP', False),
    (101, 'ROBUST_CHANNEL_NVJPG3_ERROR', 'RESTART_APP', False),
    (102, 'ROBUST_CHANNEL_NVJPG4_ERROR', 'RESTART_APP', False),
    (103, 'ROBUST_CHANNEL_NVJPG5_ERROR', 'RESTART_APP', False),
    (104, 'ROBUST_CHANNEL_NVJPG6_ERROR', 'RESTART_APP', False),
    (105, 'ROBUST_CHANNEL_NVJPG7_ERROR', 'RESTART_APP', False),
    (106, 'SMBPBI_TEST_MESSAGE', 'IGNORE', False),
    (107, 'SMBPBI_TEST_MESSAGE_SILENT', 'IGNORE', False),
    (108, 'DESTINATION_FLA_TRANSLATION_ERROR', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (109, 'ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR', 'RESET_GPU', True),
    (110, 'SEC_FAULT_ERROR', 'RESET_GPU', True),
    (111, 'BUNDLE_ERROR_EVENT', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (112, 'DISP_SUPERVISOR_ERROR', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (113, 'DP_LT_FAILURE', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (114, 'HEAD_RG_UNDERFLOW', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (115, 'CORE_CHANNEL_REGS', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (116, 'WINDOW_CHANNEL_REGS', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (117, 'CURSOR_CHANNEL_REGS', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (118, 'HEAD_REGS', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (119, 'GSP_RPC_TIMEOUT', 'RESET_GPU', True),
    (120, 'GSP_ERROR', 'RESET_GPU', True),
    (121, 'C2C_ERROR', 'IGNORE', False),
    (122, 'SPI_PMU_RPC_READ_FAIL', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (123, 'SPI_PMU_RPC_WRITE_FAIL', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (124, 'SPI_PMU_RPC_ERASE_FAIL', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (125, 'INFOROM_FS_ERROR', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (126, 'ROBUST_CHANNEL_CE10_ERROR', 'RESTART_APP', False),
    (127, 'ROBUST_CHANNEL_CE11_ERROR', 'RESTART_APP', False),
    (128, 'ROBUST_CHANNEL_CE12_ERROR', 'RESTART_APP', False),
    (129, 'ROBUST_CHANNEL_CE13_ERROR', 'RESTART_APP', False),
    (130, 'ROBUST_CHANNEL_CE14_ERROR', 'RESTART_APP', False),
    (131, 'ROBUST_CHANNEL_CE15_ERROR', 'RESTART_APP', False),
    (132, 'ROBUST_CHANNEL_CE16_ERROR', 'RESTART_APP', False),
    (133, 'ROBUST_CHANNEL_CE17_ERROR', 'RESTART_APP', False),
    (134, 'ROBUST_CHANNEL_CE18_ERROR', 'RESTART_APP', False),
    (135, 'ROBUST_CHANNEL_CE19_ERROR', 'RESTART_APP', False),
    (136, 'ALI_TRAINING_FAIL', 'RESET_GPU', True),
    (137, 'NVLINK_FLA_PRIV_ERR', 'IGNORE', False),
    (138, 'ROBUST_CHANNEL_DLA_ERROR', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (139, 'ROBUST_CHANNEL_OFA1_ERROR', 'RESTART_APP', False),
    (140, 'UNRECOVERABLE_ECC_ERROR_ESCAPE', 'RESET_GPU', True),
    (141, 'ROBUST_CHANNEL_FAST_PATH_ERROR', 'IGNORE', False),
    (142, 'ROBUST_CHANNEL_NVENC3_ERROR', 'UNEXPECTED_ERR_REPORT_ISSUE', True),
    (143, 'GPU_INIT_ERROR', 'RESET_GPU', True),
    (144, 'NVLINK_SAW_ERROR', 'WORKFLOW_NVLINK5_ERR', True),
    (145, 'NVLINK_RLW_ERROR', 'WORKFLOW_NVLINK5_ERR', True),
    (146, 'NVLINK_TLW_ERROR', 'WORKFLOW_NVLINK5_ERR', True),
    (147, 'NVLINK_TREX_ERROR', 'WORKFLOW_NVLINK5_ERR', True),
    (148, 'NVLINK_NVLPW_CTRL_ERROR', 'WORKFLOW_NVLINK5_ERR', True),
    (149, 'NVLINK_NETIR_ERROR', 'WORKFLOW_NVLINK5_ERR', True),
    (150, 'NVLINK_MSE_ERROR', 'WORKFLOW_NVLINK5_ERR', True),
    (151, 'ROBUST_CHANNEL_KEY_ROTATION_ERROR', 'RESTART_VM', True),
    (152, 'ROBUST_CHANNEL_DLA_SMMU_ERROR', 'IGNORE', False),
    (153, 'ROBUST_CHANNEL_DLA_TIMEOUT', 'IGNORE', False),
    (154, 'GPU_RECOVERY_ACTION_CHANGED', 'FOLLOW_OTHER_XID', False),
    (155, 'NVLINK_SW_DEFINED_ERROR', 'RESET_GPU', True),
    (156, 'RESOURCE_RETIREMENT_EVENT', 'RESET_GPU', True),
    (157, 'RESOURCE_RETIREMENT_FAILURE', 'IGNORE', False),
    (158, 'GPU_FATAL_TIMEOUT', 'RESET_GPU', True),
    (159, 'ROBUST_CHANNEL_CHI_NON_DATA_ERROR', 'CHECK_UVM', False),
    (160, 'CHANNEL_RETIREMENT_EVENT', 'RESTART_BM', True),
    (161, 'CHANNEL_RETIREMENT_FAILURE', 'IGNORE', False),
    (162, '', 'RESET_GPU', True),
)

APPLICATION = "application"
MEMORY = "memory"
BUS = "bus"
GSP = "gsp"
HARDWARE = "hardware"
AMBIGUOUS = "ambiguous"
NOT_A_FAILURE = "not-a-failure"

#: Blame of each class (`verdicts.BLAMES`); None: never a cause.
CLASS_BLAME: dict[str, str | None] = {APPLICATION: "image", MEMORY: "machine", BUS: "machine", GSP: "machine",
                                      HARDWARE: "machine", AMBIGUOUS: "unknown", NOT_A_FAILURE: None}

_EXPLICIT: dict[int, str] = {
    **{x: APPLICATION for x in (11, 13, 25, 31, 43, 69)},
    **{x: MEMORY for x in (48, 58, 63, 64, 92, 94, 95, 140, 156, 157)},
    79: BUS,
    119: GSP, 120: GSP,
    **{x: HARDWARE for x in (80, 154, 161)},
    **{x: NOT_A_FAILURE for x in (14, 106, 107)},
}


@dataclass(frozen=True)
class Xid:
    code: int
    mnemonic: str
    nvidia_action: str
    fatal: bool
    klass: str

    @property
    def blame(self) -> str | None:
        return CLASS_BLAME[self.klass]


def _class_of(code: int, fatal: bool) -> str:
    return _EXPLICIT.get(code, HARDWARE if fatal else AMBIGUOUS)


XIDS: dict[int, Xid] = {code: Xid(code, mnemonic, action, fatal, _class_of(code, fatal))
                        for code, mnemonic, action, fatal in XID_CATALOGUE}


def xids_of(klass: str) -> tuple[int, ...]:
    """The catalogue's Xids of one class, ascending."""
    return tuple(code for code, xid in XIDS.items() if xid.klass == klass)
