"""An HTCondor execute-node emulator (startd + starter) that runs the real fetch-work hooks."""

from .model import EmulatorConfig, EmulatorReport, JobRun
from .spawn import HookCall
from .startd import Emulator

__all__ = ["Emulator", "EmulatorConfig", "EmulatorReport", "HookCall", "JobRun"]
