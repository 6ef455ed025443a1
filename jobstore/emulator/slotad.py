"""Slot ads shaped like the real startd's (template: a captured HTCondor 25.13.2 slot ad)."""
# ruff: noqa: E501

from __future__ import annotations

import classad2

from jobstore.emulator.classad_wire import is_private

# Attributes that do not change per slot; the rest is set by `publish` in startd.py.
STATIC_TEMPLATE = """\
AcceptedWhileDraining = false
ActivationRequests = 0
Arch = "X86_64"
COLLECTOR_HOST_STRING = "127.0.0.1:9618"
CanHibernate = false
ClaimRequests = 0
CondorLoadAvg = 0.0
CondorPlatform = "$CondorPlatform: X86_64-Debian_12 $"
CondorScratchDir = "#CoNdOrScRaTcHdIr#"
CondorVersion = "$CondorVersion: 25.13.2 2026-11-22 $"
CpuBusy = false
CpuCacheSize = 1024
CpuFamily = 25
CpuModelNumber = 17
DaemonCoreDutyCycle = 0.007025195352203473
ExecuteVolume = "65024"
HardwareAddress = "00:00:00:00:00:00"
HasCommonFilesTransfer = 2
HasFileTransfer = true
HasIOProxy = true
HasJICLocalConfig = true
HasJICLocalStdin = true
HasJobDeferral = true
HasJobNetworking = true
HasJobTransferPlugins = true
HasOsUser = true
HasPerFileEncryption = true
HasReconnect = true
HasRotationalScratch = true
HasSelfCheckpointTransfers = true
HasSshd = false
HasStartDaemonAd = true
HasTDP = true
HasTransferInputRemaps = true
HasUserNamespaces = true
HasVM = false
HibernationLevel = 0
HibernationState = "NONE"
HibernationSupportedStates = ""
IsLocalStartd = false
IsWakeAble = false
IsWakeOnLanEnabled = false
IsWakeOnLanSupported = false
JobPreemptions = 0
JobRankPreemptions = 0
JobUserPrioPreemptions = 0
LoadAvg = 0.25
MachineMaxVacateTime = 10 * 60
MachineResources = "Cpus Memory Disk Swap"
MappingMethod = "Hardlink"
MaxJobRetirementTime = 0
Microarch = "x86_64-v4"
MonitorSelfAge = 1
MonitorSelfCPUUsage = 1.0
MonitorSelfImageSize = 22000
MonitorSelfRegisteredSocketCount = 1
MonitorSelfResidentSetSize = 16456
MonitorSelfSecuritySessions = 4
MyType = "Machine"
NewDSlotNotMatch = 0
NumPids = 0
OpSys = "LINUX"
OpSysAndVer = "Debian12"
OpSysLegacy = "LINUX"
OpSysLongName = "Debian GNU/Linux 12"
OpSysMajorVer = 12
OpSysName = "Debian"
OpSysShortName = "Debian"
OpSysVer = 1200
RecentActivationRequests = 0
RecentClaimRequests = 0
RecentDaemonCoreDutyCycle = 0.007025195352203473
RecentJobPreemptions = 0
RecentJobRankPreemptions = 0
RecentJobUserPrioPreemptions = 0
RecentNewDSlotNotMatch = 0
RetirementTimeRemaining = 0
SlotWeight = Cpus
StarterAbilityList = "HasVM,HasTDP,HasSshd,HasOsUser,HasReconnect,HasJobDeferral,HasFileTransfer,HasJICLocalStdin,HasJobNetworking,HasJICLocalConfig,HasPerFileEncryption,HasJobTransferPlugins,HasCommonFilesTransfer,HasTransferInputRemaps,HasSelfCheckpointTransfers"
SubnetMask = "255.0.0.0"
TargetType = "Job"
TimeToLive = 2147483647
Unhibernate = MY.MachineLastMatchTime =!= undefined
UtsnameMachine = "x86_64"
UtsnameRelease = "6.18.44-fc-v669"
UtsnameSysname = "Linux"
UtsnameVersion = "#1 SMP PREEMPT_DYNAMIC @0"
WakeOnLanEnabledFlags = "NONE"
WakeOnLanSupportedFlags = "NONE"
has_avx = true
has_avx2 = true
has_avx512_vnni = true
has_avx512dq = true
has_avx512f = true
has_sse4_1 = true
has_sse4_2 = true
has_ssse3 = true
"""

# Policy expressions the internal ad (REPLY_FETCH, EVICT_CLAIM) carries from configuration.
CONFIG_ATTRS = """\
CLAIM_WORKLIFE = 1200
CONTINUE = true
HIBERNATE = false
IsOwner = false
KILL = false
PERIODIC_CHECKPOINT = ((time() - LastPeriodicCheckpoint) / 60.0) > (180.0 + -3)
PREEMPT = false
RunBenchmarks = false
SUSPEND = false
WANT_HOLD = false
WANT_SUSPEND = false
WANT_VACATE = false
"""

WITHIN_RESOURCE_LIMITS = (
    "MY.Cpus > 0 && TARGET.RequestCpus <= MY.Cpus && MY.Memory > 0 && "
    "TARGET.RequestMemory <= MY.Memory && MY.Disk > 0 && TARGET.RequestDisk <= MY.Disk"
)

FETCH_ONLY_ATTRS = ("LastHeardFrom", "DaemonStartTime")

_template_ad: classad2.ClassAd | None = None


def base_ad(host: str, sinful: str, port: int) -> classad2.ClassAd:
    """A fresh ad holding the static attributes with this host's names filled in."""
    global _template_ad
    if _template_ad is None:
        _template_ad = classad2.parseOne(STATIC_TEMPLATE, classad2.ParserType.Old)
    ad = classad2.ClassAd()
    for name in _template_ad:
        ad[name] = _template_ad.lookup(name)
    ad["UtsnameNodename"] = host
    ad["PrivateNetworkName"] = host
    ad["MyAddress"] = sinful
    ad["StartdIpAddr"] = sinful
    ad["AddressV1"] = (
        f'{{[ p="primary"; a="127.0.0.1"; port={port}; n="Internet"; alias="{host}"; ], '
        f'[ p="IPv4"; a="127.0.0.1"; port={port}; n="Internet"; alias="{host}"; ]}}'
    )
    return ad


def internal_ad(public: classad2.ClassAd, start: str, fetch_work_delay: str) -> classad2.ClassAd:
    """The slot's r_classad with its chained config ad, as REPLY_FETCH sees it."""
    ad = classad2.parseOne(CONFIG_ATTRS, classad2.ParserType.Old)
    ad["START"] = classad2.ExprTree(start)  # first spelling wins: `START`, not `Start`
    ad["FetchWorkDelay"] = classad2.ExprTree(fetch_work_delay)
    for name in public:
        if name not in FETCH_ONLY_ATTRS and not is_private(name):
            ad[name] = public.lookup(name)
    return ad
