"""A sandbox's files in direct mode (no agent): the hook process, as the job's user, serves
its own calls with jobstore.node.sandboxcalls on its own database session (whose identity the
database checks), and fills or empties the sandbox as the agent's client would."""

from __future__ import annotations

from jobstore.node.handlers import HookRequest
from jobstore.node.sandbox import Files, SandboxError, stage_in, stage_out
from jobstore.node.sandboxcalls import handle


class DirectFiles(Files):
    """The calls served in this process."""

    def call(self, name: str, argv: list[str], data: bytes = b"") -> bytes:
        response = handle(HookRequest(hook=name, argv=[*self.who, *argv], stdin=data))
        if response.error:
            raise SandboxError(response.error)
        return response.stdout


def transfer(hook: str, ad: bytes) -> bytes:
    """PREPARE_JOB's filling or JOB_EXIT's sending of a sandbox, in this process."""
    files = DirectFiles(ad)
    if hook == "prepare_job":
        return stage_in(ad, files.manifest, files.read)
    return stage_out(ad, files.manifest, files.send)
