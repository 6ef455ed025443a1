"""The per-node jobstore agent: a local service the hook executables talk to (stdlib-only client).

Kept empty on purpose: the thin hooks import `jobstore.agent.client`, and nothing here may pull
in more than the standard library.
"""
