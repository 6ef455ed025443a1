"""An HTCondor execute-node emulator (startd + starter) that runs the real fetch-work hooks."""

from jobstore.emulator.model import EmulatorConfig, EmulatorReport, JobRun
from jobstore.emulator.spawn import HookCall
from jobstore.emulator.startd import Emulator

__all__ = ["Emulator", "EmulatorConfig", "EmulatorReport", "HookCall", "JobRun"]
