"""A sandbox's files in direct mode (no agent): the hook process, as the job's user, serves
its own calls with jobstore.node.sandboxcalls on its own database session (whose identity the
database checks); jobstore.node.sandbox.transfer fills or empties the sandbox with them."""

from __future__ import annotations

from jobstore.errors import SandboxError
from jobstore.node.hookcall import HookRequest
from jobstore.node.sandbox import Files
from jobstore.node.sandboxcalls import handle
from jobstore.node.services import direct


class DirectFiles(Files):
    """The calls served in this process."""

    def call(self, name: str, argv: list[str], data: bytes = b"") -> bytes:
        response = handle(HookRequest(hook=name, argv=[*self.who, *argv], stdin=data,
                                      node=direct()))
        if response.error:
            raise SandboxError(response.error)
        return response.stdout
