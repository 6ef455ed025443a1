"""A condor_starter for one fetched job (JICLocal; protocol section 7 and 8)."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

import classad2

from jobstore.emulator import classad_wire as wire
from jobstore.emulator.jobproc import (
    Usage,
    parse_args_v1,
    parse_args_v2,
    parse_env_v1,
    parse_env_v2,
    sample_usage,
)
from jobstore.emulator.model import STARTER_HOOKS, EmulatorConfig, JobRun, StartdSide
from jobstore.emulator.spawn import (
    Account,
    HookCall,
    ProcessRegistry,
    check_hook_path,
    current_account,
    kill_group,
    lookup_account,
    open_pidfd,
    run_hook,
    wait_pid_exit,
)
from jobstore.errors import InvalidInput, StarterFailed


class Starter:
    """Runs in its own thread; reports back through `on_exit`."""

    def __init__(
        self,
        emu: StartdSide,
        slot_name: str,
        job_text: str,
        machine_text: str,
        run: JobRun,
        on_exit: Callable[[Starter], None],
    ) -> None:
        self.emu = emu
        self.config: EmulatorConfig = emu.config
        self.registry: ProcessRegistry = emu.registry
        self.slot_name = slot_name  # e.g. "slot1" or "slot1_1"
        self.job_text = job_text
        self.machine_text = machine_text
        self.run = run
        self.on_exit = on_exit
        self.secret = secrets.token_hex(16)
        self._lock = threading.Lock()
        self._vacate: tuple[str, int, int] | None = None
        self._pid: int | None = None
        self._exited = False
        self.thread = threading.Thread(
            target=self._thread, name=f"starter-{slot_name}", daemon=True
        )
        self.ad = classad2.ClassAd()
        self.hooks: dict[str, str] = {}
        self.account: Account | None = None
        self.home = ""
        self.scratch = ""
        self.iwd = ""
        self.usage = Usage()
        self._fire_and_forget: list[threading.Thread] = []

    # -- control from the startd ------------------------------------------------------------

    def start(self) -> None:
        self.thread.start()

    def vacate(self, fast: bool, reason: str, code: int, subcode: int = 0) -> None:
        """Soft (SIGTERM to the job) or fast (SIGKILL to its family) shutdown of the job."""
        with self._lock:
            if self._vacate is None:
                self._vacate = (reason, code, subcode)
            pid, exited = self._pid, self._exited
        if pid is not None and not exited:
            if fast:
                kill_group(pid, signal.SIGKILL)
                return
            try:
                os.kill(pid, self._kill_sig())
            except ProcessLookupError:
                return
            timer = threading.Timer(self._max_vacate_time(), self._hard_kill, args=(pid,))
            timer.daemon = True
            timer.start()

    def _kill_sig(self) -> int:
        """The job's KillSig (a name or a number), SIGTERM when it has none or a bad one."""
        value = wire.eval_attr(self.ad, "KillSig")
        try:
            if isinstance(value, int):
                return int(signal.Signals(value))
            name = str(value).upper()
            return int(signal.Signals[name if name.startswith("SIG") else "SIG" + name])
        except (KeyError, ValueError):
            return int(signal.SIGTERM)

    def _max_vacate_time(self) -> float:
        """min(JobMaxVacateTime, MachineMaxVacateTime), as the starter's graceful shutdown."""
        job = wire.eval_attr(self.ad, "JobMaxVacateTime")
        machine = self.config.max_vacate_time
        return min(float(job), machine) if isinstance(job, int | float) and job >= 0 else machine

    def _hard_kill(self, pid: int) -> None:
        with self._lock:
            exited = self._exited
        if not exited:
            kill_group(pid, signal.SIGKILL)

    @property
    def vacated(self) -> bool:
        return self._vacate is not None

    # -- the starter's life -------------------------------------------------------------------

    def _thread(self) -> None:
        try:
            self._main()
        except StarterFailed as exc:
            self.run.outcome = "starter_failed"
            self.run.error = str(exc)
            self.run.final_ad = self.job_text
        except Exception as exc:  # an emulator bug: record it, never raise into the startd
            self.run.outcome = "emulator_error"
            self.run.error = repr(exc)
        finally:
            self.run.ended = self.run.ended or time.time()
            if self.scratch and not self.config.keep_sandboxes:
                shutil.rmtree(os.path.dirname(self.scratch), ignore_errors=True)
            self.run.done.set()
            self.on_exit(self)

    def _main(self) -> None:
        self.ad = wire.parse_job_ad(self.job_text)
        self._init_checks()
        self._make_sandbox()
        self._update_job_info(self._bare_ad())  # observed: once, before PREPARE_JOB
        if not self._prepare_job():
            self.run.outcome = "prepare_failed"
            self._job_exit("evict", self._bare_ad(), {})
            return
        if self.vacated:
            self.run.outcome = "evicted"
            self.run.evicted = True
            self._job_exit("evict", self._vacate_ad(self._bare_ad()), {})
            return
        proc = self._spawn_job()
        if proc is None:
            self.run.outcome = "spawn_failed"
            self._job_exit("evict", self._bare_ad(), {})
            return
        status, rusage = self._wait_job(proc)
        self._job_finished(status, rusage)

    def _init_checks(self) -> None:
        keyword = wire.eval_attr(self.ad, "HookKeyword")
        if type(keyword) is str and keyword == self.config.keyword:
            self.hooks = {h: p for h, p in self.config.hooks.items() if h in STARTER_HOOKS}
        elif not self.config.reproduce_keyword_bug and keyword is None:
            self.hooks = {}
        for hook, path in self.hooks.items():
            err = check_hook_path(path)
            if err is not None:
                raise StarterFailed(f"invalid {hook} hook: {err}")
        cmd = wire.eval_attr(self.ad, "Cmd")
        if type(cmd) is not str or not cmd:
            raise StarterFailed("Cmd not found in job ad")
        universe = wire.eval_attr(self.ad, "JobUniverse")
        if universe is not None and not (type(universe) is int and universe == 5):
            raise StarterFailed(f"unsupported JobUniverse {universe!r}")
        if self.emu.root_mode:
            self.account = self._job_account()
            self.home = self.account.home
        else:
            self.home = current_account().home

    def _job_account(self) -> Account:
        name = None
        os_user = wire.eval_attr(self.ad, "OsUser")
        user = wire.eval_attr(self.ad, "User")
        if type(os_user) is str and os_user:
            name = os_user
        elif type(user) is str and user:
            name = user.rpartition("@")[0] if "@" in user else user
        if not name:
            raise StarterFailed("Failed to find OsUser or User in job ad")
        account = lookup_account(name)
        if account is None:
            raise StarterFailed(f"no such account {name!r}")
        if account.uid == 0:
            raise StarterFailed("Attempt to initialize user_priv with root privileges rejected")
        return account

    def _make_sandbox(self) -> None:
        execute = self.emu.execute_dir
        while True:
            top = os.path.join(execute, f"dir_{self.emu.next_starter_pid()}")
            try:
                os.mkdir(top, 0o755)
                break
            except FileExistsError:
                continue
        self.scratch = os.path.join(top, "scratch")
        os.mkdir(self.scratch, 0o700)
        if self.account is not None:
            os.chown(self.scratch, self.account.uid, self.account.gid)
        cmd = wire.eval_attr(self.ad, "Cmd")
        assert isinstance(cmd, str)
        self.ad["OrigCmd"] = cmd
        iwd = wire.eval_attr(self.ad, "Iwd")
        if type(iwd) is str and iwd:
            self.ad["OrigIwd"] = iwd
            self.iwd = iwd
        else:
            self.iwd = self.scratch
            self.ad["Iwd"] = self.scratch
        if not os.path.isabs(cmd):
            self.ad["Cmd"] = os.path.normpath(os.path.join(self.iwd, cmd))
        self._write_private(".job.ad", wire.sprint_ad(self.ad))
        self._write_private(".machine.ad", self.machine_text)

    def _write_private(self, name: str, text: str) -> None:
        path = os.path.join(self.scratch, name)
        with open(path, "w") as f:
            f.write(text)
        if self.account is not None:
            os.chown(path, self.account.uid, self.account.gid)

    def _bare_ad(self) -> classad2.ClassAd:
        return wire.copy_ad(self.ad)

    def _vacate_ad(self, ad: classad2.ClassAd) -> classad2.ClassAd:
        if self._vacate is not None:
            reason, code, subcode = self._vacate
            ad["VacateReason"] = reason
            ad["VacateReasonCode"] = code
            ad["VacateReasonSubCode"] = subcode
        return ad

    # -- hooks ---------------------------------------------------------------------------------

    def _env(self, started: bool, extra: dict[str, str]) -> dict[str, str]:
        env = dict(self.config.env)
        tmp = self.iwd if started else self.scratch
        env.update(
            {
                "CONDOR_PRIVATE_INHERIT": self.secret,
                "_CONDOR_EXECUTE": self.emu.execute_dir,
                "_CONDOR_SLOT": self.slot_name,
                "_CONDOR_SCRATCH_DIR": self.scratch,
                "_CONDOR_JOB_AD": os.path.join(self.scratch, ".job.ad"),
                "_CONDOR_MACHINE_AD": os.path.join(self.scratch, ".machine.ad"),
                "_CONDOR_JOB_IWD": self.iwd,
                "_CONDOR_JOB_PIDS": "",
                "BATCH_SYSTEM": "HTCondor",
                "TMPDIR": tmp,
                "TEMP": tmp,
                "TMP": tmp,
                "HOME": self.home,
            }
        )
        env.update(extra)
        return env

    def _call(
        self, hook: str, argv: list[str], ad: classad2.ClassAd, env: dict[str, str]
    ) -> HookCall:
        call = HookCall(
            hook=hook,
            argv=[self.hooks[hook], *argv],
            slot=self.slot_name,
            stdin=wire.sprint_ad(ad).encode(),
            env=env,
            cwd=self.scratch,
            user=self.account.name if self.account else current_account().name,
        )
        self.emu.record(call)
        return call

    def _run(self, call: HookCall, timeout: float | None = None) -> HookCall:
        return run_hook(
            call, account=self.account, kill_family=False, timeout=timeout, registry=self.registry
        )

    def _update_job_info(self, ad: classad2.ClassAd, started: bool = False) -> None:
        if "UPDATE_JOB_INFO" not in self.hooks:
            return
        pids = str(self._pid) if started and self._pid and not self._exited else ""
        env = self._env(started, {"_CONDOR_JOB_PIDS": pids})
        call = self._call("UPDATE_JOB_INFO", [], ad, env)
        t = threading.Thread(target=self._run, args=(call,), daemon=True)
        self.emu.track(t)
        t.start()

    def _prepare_job(self) -> bool:
        """PREPARE_JOB and the status rules of section 8; True when the job may run."""
        if "PREPARE_JOB" not in self.hooks:
            return True
        call = self._run(self._call("PREPARE_JOB", [], self._bare_ad(), self._env(False, {})))
        if call.error is not None:
            return False
        update = wire.parse_prepare_output(call.stdout)
        status = call.exit_status if call.exit_status is not None else 1
        if status >= 0:
            code = wire.eval_attr(update, "HookStatusCode")
            if type(code) is int and code >= 0:
                status = code
        if status != 0:
            return False
        for name in update:
            self.ad[name] = update.lookup(name)
        return True

    def _job_exit(self, reason: str, ad: classad2.ClassAd, extra_env: dict[str, str]) -> None:
        self.run.final_ad = wire.sprint_ad(ad)
        self.run.ended = self.run.ended or time.time()
        if "JOB_EXIT" not in self.hooks:
            return
        started = self.run.started is not None
        call = self._call("JOB_EXIT", [reason], ad, self._env(started, extra_env))
        self._run(call, timeout=self.config.job_exit_timeout)

    # -- the job -------------------------------------------------------------------------------

    def _spawn_job(self) -> subprocess.Popen | None:
        try:
            argv, env = self._job_command()
            stdio = self._job_stdio()
        except (ValueError, OSError) as exc:
            self.run.error = f"cannot start job: {exc}"
            return None
        creds: dict[str, Any] = {}
        if self.account is not None:
            creds = {
                "user": self.account.uid,
                "group": self.account.gid,
                "extra_groups": list(self.account.groups),
            }
        with self._lock:
            if self._vacate is not None:
                for fd in stdio:
                    os.close(fd)
                return None
            try:
                proc = subprocess.Popen(
                    argv,
                    executable=argv[0],
                    stdin=stdio[0],
                    stdout=stdio[1],
                    stderr=stdio[2],
                    cwd=self.iwd,
                    env=env,
                    start_new_session=True,
                    close_fds=True,
                    **creds,  # type: ignore[arg-type]
                )
            except (OSError, subprocess.SubprocessError) as exc:
                self.run.error = f"cannot start job: {exc}"
                return None
            finally:
                for fd in stdio:
                    os.close(fd)
            self._pid = proc.pid
        self.registry.add(proc.pid)
        self.run.started = time.time()
        self.ad["JobPid"] = proc.pid
        self.ad["JobStartDate"] = int(self.run.started)
        self.ad["Renice"] = 0
        self.emu.job_started(self)
        return proc

    def _job_command(self) -> tuple[list[str], dict[str, str]]:
        cmd = wire.eval_attr(self.ad, "Cmd")
        if type(cmd) is not str or not cmd:
            raise InvalidInput("no Cmd")
        if not os.path.isabs(cmd):
            cmd = os.path.join(self.iwd, cmd)
        arguments = wire.eval_attr(self.ad, "Arguments")
        args_v1 = wire.eval_attr(self.ad, "Args")
        if type(arguments) is str:
            args = parse_args_v2(arguments)
        elif type(args_v1) is str:
            args = parse_args_v1(args_v1)
        else:
            args = []
        environment = wire.eval_attr(self.ad, "Environment")
        env_v1 = wire.eval_attr(self.ad, "Env")
        if type(environment) is str:
            job_env = parse_env_v2(environment)
        elif type(env_v1) is str:
            job_env = parse_env_v1(env_v1)
        else:
            job_env = {}
        env = {
            "_CONDOR_SCRATCH_DIR": self.scratch,
            "_CONDOR_SLOT": self.slot_name,
            "_CONDOR_JOB_AD": os.path.join(self.scratch, ".job.ad"),
            "_CONDOR_MACHINE_AD": os.path.join(self.scratch, ".machine.ad"),
            "_CONDOR_JOB_IWD": self.iwd,
            "BATCH_SYSTEM": "HTCondor",
            "TMPDIR": self.scratch,
            "TEMP": self.scratch,
            "TMP": self.scratch,
            "HOME": self.home,
        }
        env.update(job_env)
        return [cmd, *args], env

    def _job_stdio(self) -> list[int]:
        """Open In/Out/Err (relative to Iwd) as fds; Out and Err may name the same file."""
        fds: list[int] = []
        opened: dict[str, int] = {}
        try:
            for attr in ("In", "Out", "Err"):
                value = wire.eval_attr(self.ad, attr)
                path = value if type(value) is str and value else os.devnull
                path = os.path.join(self.iwd, path)
                if attr != "In" and path in opened:
                    fds.append(os.dup(opened[path]))
                    continue
                if attr == "In" or path == os.devnull:
                    fd = os.open(path, os.O_RDONLY if attr == "In" else os.O_WRONLY)
                else:
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                    if self.account is not None:
                        os.fchown(fd, self.account.uid, self.account.gid)
                    opened[path] = fd
                fds.append(fd)
        except OSError:
            for fd in fds:
                os.close(fd)
            raise
        return fds

    def _wait_job(self, proc: subprocess.Popen) -> tuple[int, object]:
        pidfd = open_pidfd(proc.pid)
        try:
            interval = self.config.update_interval
            next_update = time.monotonic() + min(self.config.initial_update_interval, interval)
            while True:
                left = max(0.0, next_update - time.monotonic())
                if wait_pid_exit(proc.pid, pidfd, left):
                    break
                self._sample(proc.pid)
                self._update_job_info(self._usage_ad(), started=True)
                next_update = time.monotonic() + interval
            self._sample(proc.pid)
            _, status, rusage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
        finally:
            if pidfd is not None:
                os.close(pidfd)
        kill_group(proc.pid, signal.SIGKILL)  # leftovers of the job's family
        self.registry.discard(proc.pid)
        with self._lock:
            self._exited = True
        self.run.ended = time.time()
        return status, rusage

    def _sample(self, pid: int) -> None:
        usage = sample_usage(pid)
        if usage.num_pids:
            prev = self.usage
            usage.image_kib = max(usage.image_kib, prev.image_kib)
            usage.rss_kib = max(usage.rss_kib, prev.rss_kib)
            self.usage = usage

    def _usage_ad(self) -> classad2.ClassAd:
        ad = self._bare_ad()
        assert self.run.started is not None
        lifetime = int(time.time() - self.run.started)
        for name in ("BlockReadKbytes", "BlockReads", "BlockWriteKbytes", "BlockWrites"):
            ad[name] = 0
            ad[f"Recent{name}"] = 0
        ad["ImageSize"] = self.usage.image_kib
        ad["JobState"] = "Running"
        ad["MemoryUsage"] = classad2.ExprTree("((ResidentSetSize + 1023) / 1024)")
        ad["NumPids"] = self.usage.num_pids
        ad["RecentStatsLifetime"] = lifetime
        ad["RemoteSysCpu"] = float(self.usage.sys_cpu)
        ad["RemoteUserCpu"] = float(self.usage.user_cpu)
        ad["ResidentSetSize"] = self.usage.rss_kib
        ad["StatsLifetime"] = lifetime
        return self._vacate_ad(ad)

    def _job_finished(self, status: int, rusage: object) -> None:
        self.usage.user_cpu = max(self.usage.user_cpu, float(rusage.ru_utime))  # type: ignore[attr-defined]
        self.usage.sys_cpu = max(self.usage.sys_cpu, float(rusage.ru_stime))  # type: ignore[attr-defined]
        self.usage.rss_kib = max(self.usage.rss_kib, int(rusage.ru_maxrss))  # type: ignore[attr-defined]
        self._update_job_info(self._usage_ad(), started=True)  # final one, still "Running"
        ad = self._usage_ad()
        assert self.run.started is not None and self.run.ended is not None
        ad["JobState"] = "Exited"
        ad["NumPids"] = 0
        ad["JobDuration"] = round(self.run.ended - self.run.started, 6)
        extra: dict[str, str] = {}
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            self.run.exit_signal = sig
            ad["ExitBySignal"] = True
            ad["ExitSignal"] = sig
            ad["ExitReason"] = f"died on signal {sig} ({signal.strsignal(sig)})"
            if os.WCOREDUMP(status):
                ad["JobCoreDumped"] = True
            extra["_CONDOR_MAINJOB_EXIT_SIGNAL"] = str(sig)
        else:
            code = os.WEXITSTATUS(status)
            self.run.exit_code = code
            ad["ExitBySignal"] = False
            ad["ExitCode"] = code
            extra["_CONDOR_MAINJOB_EXIT_CODE"] = str(code)
        self.run.evicted = self.vacated
        self.run.outcome = "evicted" if self.vacated else "exited"
        self._job_exit("evict" if self.vacated else "exit", ad, extra)
