"""The one error type of the connection layer: a reason token and one line for a person."""

from __future__ import annotations


class RemoteError(Exception):
    """A node could not be reached, or a command or file operation on it failed.

    ``reason`` is a short token (the fleet's ``LinkError`` reasons: refused, timeout, dns,
    network, auth, host_key, config, shell, deploy, closed, lost); ``message`` is one line that
    says what went wrong and, where it can, what to do. ``hop`` names the jump host that failed
    when the failure happened on the way to the node (``message`` is then that hop's own).
    """

    def __init__(self, reason: str, message: str, *, hop: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.hop = hop

    def for_node(self, node: str) -> RemoteError:
        """This error as seen from ``node``: a jump host's failure names the hop and the node."""
        if self.hop is None:
            return self
        return RemoteError(self.reason, f"jump host {self.hop} for {node}: {self.message}")
