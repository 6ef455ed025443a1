"""The condor_startd side: slots, the fetch loop, claims (protocol sections 4.1, 4.2, 6)."""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import random
import secrets
import threading
import time
from collections.abc import Callable

import classad2

from jobstore.emulator import classad_wire as wire
from jobstore.emulator.model import (
    STARTD_HOOKS,
    STARTER_HOOKS,
    EmulatorConfig,
    EmulatorReport,
    JobRun,
)
from jobstore.emulator.slotad import internal_ad
from jobstore.emulator.slots import Claim, Slot, public_ad
from jobstore.emulator.spawn import (
    HookCall,
    ProcessRegistry,
    check_hook_path,
    current_account,
    lookup_account,
    run_hook,
)
from jobstore.emulator.starter import Starter
from jobstore.errors import InvalidInput

SHUTDOWN_REASON = ("Startd was shutdown", 1013)
VACATE_REASON = ("Claim vacated by the administrator", 1010)
SOFT_KILL_GRACE = 10.0  # seconds a shutdown waits for SIGTERMed jobs before SIGKILL
POLL = 0.02


class Emulator:
    """A startd with static or partitionable slots, and a starter per accepted job."""

    def __init__(self, config: EmulatorConfig) -> None:
        self.config = config
        self.report = EmulatorReport()
        self.registry = ProcessRegistry()
        self.lock = threading.RLock()
        self.root_mode = os.geteuid() == 0 and config.condor_user is not None
        self.condor_account = None
        if self.root_mode:
            assert config.condor_user is not None
            self.condor_account = lookup_account(config.condor_user)
            if self.condor_account is None:
                raise InvalidInput(f"condor_user {config.condor_user!r} does not exist")
        self.log_dir = os.path.join(config.work_dir, "log")
        self.execute_dir = os.path.join(config.work_dir, "execute")
        os.makedirs(self.log_dir, exist_ok=True)
        os.makedirs(self.execute_dir, exist_ok=True)
        os.chmod(self.execute_dir, 0o755)
        if self.condor_account is not None:
            os.chown(self.log_dir, self.condor_account.uid, self.condor_account.gid)
        self.private_inherit = secrets.token_hex(32)  # what the master would pass its children
        self.port = random.randint(20000, 60000)
        self.start_time = int(time.time())
        self.sinful = f"<127.0.0.1:{self.port}?addrs=127.0.0.1-{self.port}&alias={config.host}>"
        self._claim_seq = itertools.count(1)
        self._dslot_seq = itertools.count(1)
        self._starter_pids = itertools.count(os.getpid() * 10 + 1000)
        self._threads: list[threading.Thread] = []
        self._job_index = 0
        self._stopping = False
        self._last_activity = time.monotonic()
        self.startd_hooks: dict[str, str] = {}
        for hook, path in config.hooks.items():
            if hook in STARTD_HOOKS:
                err = check_hook_path(path)
                if err is None:
                    self.startd_hooks[hook] = path
                else:
                    self.report.refused_hooks[hook] = err
            elif hook in STARTER_HOOKS:
                err = check_hook_path(path)
                if err is not None:
                    self.report.refused_hooks[hook] = err
        self.slots: list[Slot] = self._make_slots()
        if config.first_fetch_after > 0:
            for slot in self.slots:
                slot.next_due = time.monotonic() + config.first_fetch_after

    # -- public API ------------------------------------------------------------------------------

    def run(
        self,
        until: Callable[[], bool] | None = None,
        timeout: float = 60.0,
        idle_exit_after: float | None = None,
        wait_for_jobs: bool = False,
    ) -> EmulatorReport:
        """Run until `until()` is true, `timeout` passes, or no job ran for `idle_exit_after` s.

        Then shut down like `condor_off`: running jobs are evicted ("Startd was shutdown",
        1013), or with `wait_for_jobs` allowed to finish first (within `timeout`). Interrupted
        (Ctrl-C), it evicts them at once, then lets the KeyboardInterrupt go on: no attempt is
        left running.
        """
        deadline = time.monotonic() + timeout
        self._last_activity = time.monotonic()
        try:
            self._loop(until, deadline, idle_exit_after)
        except KeyboardInterrupt:
            self._shutdown(False, time.monotonic())
            raise
        self._shutdown(wait_for_jobs, deadline)
        return self.report

    def _loop(self, until: Callable[[], bool] | None, deadline: float,
              idle_exit_after: float | None) -> None:
        while time.monotonic() < deadline:
            if until is not None and until():
                break
            self._control_requests()
            with self.lock:
                self._tick()
                busy = any(s.starter is not None for s in self.slots)
            if (
                idle_exit_after is not None
                and not busy
                and time.monotonic() - self._last_activity >= idle_exit_after
            ):
                break
            time.sleep(POLL)

    def vacate(
        self,
        slot_name: str,
        fast: bool = False,
        reason: str = VACATE_REASON[0],
        code: int = VACATE_REASON[1],
    ) -> None:
        """condor_vacate [-fast] of one slot (full name or `slotN[_M]`); thread-safe."""
        with self.lock:
            slot = self._find(slot_name)
            if slot is None:
                raise InvalidInput(f"no slot named {slot_name!r}")
            starter = slot.starter
            if starter is None:
                if slot.state == "Claimed":
                    self._end_claim(slot)
                return
            slot.set_state("Preempting", "Vacating")
        starter.vacate(fast, reason, code)

    def _control_requests(self) -> None:
        """Honour the vacate and update requests left in the control directory
        (EmulatorConfig)."""
        directory = self.config.control_dir
        if not directory:
            return
        try:
            names = os.listdir(directory)
        except OSError:
            return
        for name in names:
            if name == "update-machine-ad":
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(directory, name))
                self._update_machine_ad()
                continue
            if not name.startswith("vacate-"):
                continue
            path = os.path.join(directory, name)
            try:
                with open(path) as fh:
                    how = fh.read(64).strip()
            except OSError:
                how = ""
            with contextlib.suppress(OSError):
                os.unlink(path)
            slot = name[len("vacate-"):]
            try:
                self.vacate(slot, fast=how in ("", "-fast"))
            except ValueError:
                pass  # no such slot (any more)

    def _update_machine_ad(self) -> None:
        """UPDATE_MACHINE_AD: every slot's state is evaluated now, and an Unclaimed slot that
        waits for its fetch fetches (ResMgr::update_all -> eval_state -> tryFetchWork)."""
        with self.lock:
            now = time.monotonic()
            for slot in self.slots:
                if (slot.state == "Unclaimed" and not slot.fetching
                        and (slot.next_due is None or slot.next_due > now)):
                    slot.next_due = now

    def slot_names(self) -> list[str]:
        with self.lock:
            return [s.name for s in self.slots if not s.deleted]

    # -- helpers used by starters ---------------------------------------------------------------

    def record(self, call: HookCall) -> None:
        with self.lock:
            self.report.hook_calls.append(call)

    def track(self, thread: threading.Thread) -> None:
        with self.lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)

    def next_starter_pid(self) -> int:
        with self.lock:
            return next(self._starter_pids)

    def job_started(self, starter: Starter) -> None:
        with self.lock:
            index = self._job_index
            self._job_index += 1
            self._last_activity = time.monotonic()
        rule = self.config.vacate_after
        seconds: float | None = None
        try:
            if isinstance(rule, dict):
                seconds = rule.get(starter.run.cluster_id) if starter.run.cluster_id else None
            elif rule is not None:
                seconds = rule(index, wire.to_dict(starter.ad))
        except Exception as exc:
            starter.run.error = f"vacate_after callback failed: {exc!r}"
        if seconds is not None:
            timer = threading.Timer(seconds, self._auto_vacate, args=(starter,))
            timer.daemon = True
            timer.start()

    def _auto_vacate(self, starter: Starter) -> None:
        with self.lock:
            slot = next((s for s in self.slots if s.starter is starter), None)
        if slot is not None:
            self.vacate(slot.name, fast=self.config.vacate_fast)

    # -- slots and ads ---------------------------------------------------------------------------

    def _make_slots(self) -> list[Slot]:
        cfg = self.config
        if cfg.partitionable:
            return [self._new_slot("slot1", "Partitionable", 1, cfg.cpus, cfg.memory, cfg.disk)]
        n = max(1, cfg.static_slots)
        return [
            self._new_slot(
                f"slot{i}", "Static", i, max(1, cfg.cpus // n), cfg.memory // n, cfg.disk // n
            )
            for i in range(1, n + 1)
        ]

    def _new_slot(
        self, short: str, kind: str, slot_id: int, cpus: int, mem: int, disk: int
    ) -> Slot:
        now = int(time.time())
        return Slot(
            name=f"{short}@{self.config.host}",
            short=short,
            kind=kind,
            slot_id=slot_id,
            cpus=cpus,
            memory=mem,
            disk=disk,
            claim=self._opportunistic_claim(),
            entered_state=now,
            entered_activity=now,
        )

    def _claim_id(self, session: bool) -> str:
        seq = next(self._claim_seq)
        key = secrets.token_hex(32)
        sess = (
            '[Integrity="NO";Encryption="NO";ShortVersion="25.13.2";CryptoMethods="BLOWFISH";'
            'CryptoMethodsList="AES.BLOWFISH.3DES";]'
            if session
            else ""
        )
        return f"{self.sinful}#{self.start_time}#{seq}#{sess}{key}"

    def _opportunistic_claim(self) -> Claim:
        return Claim(id=self._claim_id(session=True), fetch=False)

    def _find(self, name: str) -> Slot | None:
        for s in self.slots:
            if not s.deleted and name in (s.name, s.short):
                return s
        return None

    def _public_ad(self, slot: Slot) -> classad2.ClassAd:
        return public_ad(slot, self.config, sinful=self.sinful, port=self.port,
                         start_time=self.start_time, all_slots=self.slots)

    def _internal_ad(self, slot: Slot) -> classad2.ClassAd:
        return internal_ad(self._public_ad(slot), self.config.start, self.config.fetch_work_delay)

    # -- the fetch loop --------------------------------------------------------------------------

    def _tick(self) -> None:
        now = time.monotonic()
        for slot in list(self.slots):
            if slot.deleted:
                continue
            if slot.next_due is not None and now >= slot.next_due:
                self._try_fetch(slot)
            claim = slot.claim
            if (
                slot.state == "Claimed"
                and slot.activity == "Idle"
                and claim.idle_since is not None
                and now - claim.idle_since > claim.lease
            ):
                self._end_claim(slot)
        self.slots = [s for s in self.slots if not s.deleted]

    def _fetch_delay(self, slot: Slot, ad: classad2.ClassAd) -> int:
        target = slot.claim.job_ad if slot.starter is not None else None
        value = wire.as_number(wire.eval_expr(self.config.fetch_work_delay, ad, target))
        return 300 if value is None else int(value)

    def _try_fetch(self, slot: Slot) -> None:
        """Resource::tryFetchWork."""
        slot.next_due = None
        path = self.startd_hooks.get("FETCH_WORK")
        if path is None or slot.deleted or slot.fetching or slot.fetch_broken or self._stopping:
            return
        now = time.monotonic()
        delay = self._fetch_delay(slot, self._public_ad(slot))
        if delay > 0 and slot.completed_mono is not None and now - slot.completed_mono < delay:
            slot.next_due = slot.completed_mono + delay
            return
        if wire.eval_expr(self.config.start, self._public_ad(slot)) is False:
            slot.next_due = now + max(delay, self.config.min_rearm)
            return
        slot.next_fetch_delay = delay
        ad = self._public_ad(slot)
        slot.fetching = True
        slot.last_spawned = int(time.time())
        call = self._startd_call("FETCH_WORK", [], slot, wire.sprint_ad(ad).encode())
        self._spawn_thread(self._fetch_thread, slot, call)

    def _startd_call(self, hook: str, argv: list[str], slot: Slot, stdin: bytes) -> HookCall:
        env = dict(self.config.env)
        env["CONDOR_PRIVATE_INHERIT"] = self.private_inherit
        acct = self.condor_account
        call = HookCall(
            hook=hook,
            argv=[self.startd_hooks[hook], *argv],
            slot=slot.name,
            stdin=stdin,
            env=env,
            cwd=self.log_dir,
            user=acct.name if acct else current_account().name,
        )
        self.record(call)
        return call

    def _run_startd_hook(self, call: HookCall) -> HookCall:
        return run_hook(
            call,
            account=self.condor_account,
            kill_family=True,
            timeout=None,
            registry=self.registry,
        )

    def _spawn_thread(self, target: Callable[..., object], *args: object) -> None:
        t = threading.Thread(target=target, args=args, daemon=True)
        self.track(t)
        t.start()

    def _fetch_thread(self, slot: Slot, call: HookCall) -> None:
        self._run_startd_hook(call)
        with self.lock:
            if call.error is not None:  # exec failed: m_currently_fetching stays true
                slot.fetch_broken = True
                return
            try:
                kind, job = wire.parse_fetch_output(call.stdout)
                self._handle_reply(slot, kind, job)
            except Exception as exc:
                call.error = f"emulator error handling the reply: {exc!r}"
            finally:
                slot.fetching = False
                slot.last_completed = int(time.time())
                slot.completed_mono = time.monotonic()
                if slot.delete_after_fetch:
                    self._delete_dslot(slot)
                elif not slot.deleted:
                    delay = self._fetch_delay(slot, self._public_ad(slot))
                    slot.next_due = slot.completed_mono + max(delay, self.config.min_rearm)

    def _handle_reply(self, slot: Slot, kind: str, job: classad2.ClassAd | None) -> None:
        """StartdHookMgr::handleHookFetchWork (6.2); called with the lock held."""
        idle_fetch = slot.claim.fetch and slot.state == "Claimed" and slot.activity == "Idle"
        if kind == "invalid":
            self.report.dropped_replies += 1
            return
        if kind == "none" or job is None or self._stopping:
            if idle_fetch:
                self._end_claim(slot)
            return
        if slot.kind == "Static":
            for attr in ("RequestCpus", "RequestMemory", "RequestDisk"):
                if attr not in job:
                    job[attr] = 1
        internal = self._internal_ad(slot)
        rank = wire.as_number(wire.eval_attr(internal, "Rank", job)) or 0.0
        if slot.state == "Preempting" or wire.eval_attr(internal, "Requirements", job) is not True:
            willing = False
        else:
            willing = not (slot.state == "Claimed" and not idle_fetch and rank <= slot.claim.rank)
        if type(wire.eval_attr(job, "HookKeyword")) is not str:
            job["HookKeyword"] = self.config.keyword
        if "REPLY_FETCH" in self.startd_hooks:
            text = wire.sprint_ad(job) + "-----\n" + wire.sprint_ad(internal)
            if willing:
                text += f'ClaimId = "{slot.claim.id}"\n'
            call = self._startd_call(
                "REPLY_FETCH", ["accept" if willing else "reject"], slot, text.encode()
            )
            self._spawn_thread(self._run_startd_hook, call)
        target = slot
        if willing and slot.kind in ("Partitionable", "Dynamic"):
            carved = self._carve(slot, job)
            if carved is None:
                willing = False
            else:
                target = carved
        if not willing:
            if idle_fetch:
                self._end_claim(slot)
            return
        if target is slot and idle_fetch:
            slot.claim.rank = rank
        elif target is slot and slot.state == "Claimed":
            self.report.lost_accepts += 1  # 10c: accepted for rank, never run
            return
        else:
            target.claim = Claim(id=self._claim_id(session=False), fetch=True, rank=rank)
        self._spawn_starter(target, job)

    def _carve(self, slot: Slot, job: classad2.ClassAd) -> Slot | None:
        """create_dslot: round the requests in the job ad, then split them off `slot`."""
        req = {
            a: wire.as_number(wire.eval_attr(job, a))
            for a in ("RequestCpus", "RequestMemory", "RequestDisk")
        }
        if any(v is None for v in req.values()):
            return None
        cpus = int(math.ceil(req["RequestCpus"] or 0))
        memory = int(math.ceil((req["RequestMemory"] or 0) / 128) * 128)
        disk = int(math.ceil((req["RequestDisk"] or 0) / 1024) * 1024)
        job["RequestMemory"] = memory
        job["RequestDisk"] = disk
        if cpus > slot.cpus or memory > slot.memory or disk > slot.disk:
            return None
        slot.cpus -= cpus
        slot.memory -= memory
        slot.disk -= disk
        pslot = slot if slot.kind == "Partitionable" else slot.parent
        assert pslot is not None
        n = next(self._dslot_seq)
        new = self._new_slot(f"{pslot.short}_{n}", "Dynamic", pslot.slot_id, cpus, memory, disk)
        new.dslot_id = n
        new.parent = pslot
        new.next_due = time.monotonic() + self.config.min_rearm
        pslot.children.append(new)
        self.slots.append(new)
        return new

    def _spawn_starter(self, slot: Slot, job: classad2.ClassAd) -> None:
        lease = wire.as_number(wire.eval_attr(job, "JobLeaseDuration"))
        slot.claim.lease = lease if lease is not None else self.config.claim_lease
        slot.claim.job_ad = job
        slot.claim.last_job_ad = job
        slot.claim.idle_since = None
        slot.set_state("Claimed", "Busy")
        slot.job_starts += 1
        job_text = wire.sprint_ad(job)
        cluster, proc = wire.eval_attr(job, "ClusterId"), wire.eval_attr(job, "ProcId")
        run = JobRun(
            slot=slot.name,
            ad=job_text,
            cluster_id=cluster if type(cluster) is int else None,
            proc_id=proc if type(proc) is int else None,
        )
        self.report.jobs.append(run)
        starter = Starter(
            self,
            slot.short,
            job_text,
            wire.sprint_ad(self._public_ad(slot)),
            run,
            self._starter_exited,
        )
        slot.starter = starter
        self._last_activity = time.monotonic()
        starter.start()

    def _starter_exited(self, starter: Starter) -> None:
        with self.lock:
            self._last_activity = time.monotonic()
            slot = next((s for s in self.slots if s.starter is starter), None)
            if slot is None:
                return
            slot.starter = None
            slot.claim.job_ad = None  # claim.cpp:1858: the starter's exit drops the job ad
            if starter.vacated or slot.state == "Preempting" or self._stopping:
                self._end_claim(slot)
                return
            slot.set_state("Claimed", "Idle")
            slot.claim.idle_since = time.monotonic()
            self._try_fetch(slot)

    def _end_claim(self, slot: Slot) -> None:
        """terminateFetchedWork -> vacate(): the slot leaves Claimed; a d-slot goes away."""
        claim = slot.claim
        if self.config.call_evict_claim and "EVICT_CLAIM" in self.startd_hooks and claim.fetch:
            job = claim.job_ad or claim.last_job_ad
            if job is not None:
                text = wire.sprint_ad(job) + "-----\n" + wire.sprint_ad(self._internal_ad(slot))
                text += f'ClaimId = "{claim.id}"\n'
                call = self._startd_call("EVICT_CLAIM", [], slot, text.encode())
                self._spawn_thread(self._run_startd_hook, call)
        if slot.kind == "Dynamic":
            slot.set_state("Unclaimed", "Idle")
            if slot.fetching:
                slot.delete_after_fetch = True
            else:
                self._delete_dslot(slot)
            return
        slot.claim = self._opportunistic_claim()
        slot.set_state("Unclaimed", "Idle")
        if slot.next_due is None and not slot.fetching:
            slot.next_due = time.monotonic()

    def _delete_dslot(self, slot: Slot) -> None:
        pslot = slot.parent
        slot.deleted = True
        slot.next_due = None
        if pslot is not None:
            pslot.cpus += slot.cpus
            pslot.memory += slot.memory
            pslot.disk += slot.disk
            pslot.children = [k for k in pslot.children if k is not slot]

    # -- shutdown ----------------------------------------------------------------------------------

    def _shutdown(self, wait_for_jobs: bool, deadline: float) -> None:
        with self.lock:
            self._stopping = True
            for s in self.slots:
                s.next_due = None
        if wait_for_jobs:
            self._join_starters(deadline)
        self._evict_all(fast=False)
        self._join_starters(time.monotonic() + SOFT_KILL_GRACE)
        self._evict_all(fast=True)
        self._join_starters(time.monotonic() + self.config.job_exit_timeout + 5)
        with self.lock:
            threads = list(self._threads)
        end = time.monotonic() + 2.0
        for t in threads:
            t.join(max(0.0, end - time.monotonic()))
        self.registry.kill_all()  # hung FETCH_WORK, abandoned JOB_EXIT, ... (family kill)
        for t in threads:
            t.join(2.0)

    def _evict_all(self, fast: bool) -> None:
        with self.lock:
            pairs = [(s, s.starter) for s in self.slots if s.starter is not None]
            for s, _ in pairs:
                s.set_state("Preempting", "Vacating")
        for _, starter in pairs:
            assert starter is not None
            starter.vacate(fast, *SHUTDOWN_REASON)

    def _join_starters(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            with self.lock:
                starters = [s.starter for s in self.slots if s.starter is not None]
            if not starters:
                return
            starters[0].thread.join(min(0.1, max(0.0, deadline - time.monotonic())))
